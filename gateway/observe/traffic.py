"""Recent traffic for the status page: per-second counts and latency samples, ten minutes deep.

What an operator reads as "errors" is the gateway's and the providers' failures: a client's own
4xx (a bad request, a wrong key, an unknown model) is counted apart and kept out of the error
rate and the latency percentiles, where a burst of instant 401s would hide a slow provider.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

HORIZON = 600
SAMPLES_PER_SECOND = 128


@dataclass(slots=True)
class _Second:
    at: int
    requests: int = 0
    errors: int = 0
    client_errors: int = 0
    cache_hits: int = 0
    hedges: int = 0
    seen: int = 0
    latencies: list[float] = field(default_factory=list)


class RecentTraffic:
    """Bounded memory whatever the load: a ring of seconds, each with a latency reservoir."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._seconds: deque[_Second] = deque(maxlen=HORIZON)
        self._rng = random.Random(0)

    def _now(self) -> _Second:
        now = int(self.clock())
        if not self._seconds or self._seconds[-1].at != now:
            self._seconds.append(_Second(now))
        return self._seconds[-1]

    def add(self, duration: float, ok: bool, client_error: bool = False,
            cache_hit: bool = False, hedged: bool = False) -> None:
        """One finished request: a success, a failure, or the client's own 4xx."""
        second = self._now()
        second.cache_hits += cache_hit
        second.hedges += hedged
        if client_error:
            second.client_errors += 1
            return
        second.requests += 1
        second.errors += not ok
        second.seen += 1
        if len(second.latencies) < SAMPLES_PER_SECOND:
            second.latencies.append(duration)
        elif (slot := int(self._rng.random() * second.seen)) < SAMPLES_PER_SECOND:
            second.latencies[slot] = duration  # reservoir sampling keeps it uniform

    def series(self, minutes: int = 5, step: int = 10) -> list[dict[str, float | int | None]]:
        """Bins of `step` seconds over the last `minutes`: rate, error rate, p50 and p99 (ms)."""
        now = int(self.clock())
        start = now - minutes * 60 + 1  # the current second is the last one shown
        bins: dict[int, list[_Second]] = {}
        for second in self._seconds:
            if second.at >= start:
                bins.setdefault((second.at - start) // step, []).append(second)
        rows = []
        for index in range((minutes * 60) // step):
            seconds = bins.get(index, [])
            requests = sum(s.requests for s in seconds)
            errors = sum(s.errors for s in seconds)
            samples = sorted(x for s in seconds for x in s.latencies)
            rows.append({
                "t": start + index * step,
                "rps": round(requests / step, 3),
                "error_rate": round(errors / requests, 4) if requests else 0.0,
                "client_errors": sum(s.client_errors for s in seconds),
                "cache_hits": sum(s.cache_hits for s in seconds),
                "hedges": sum(s.hedges for s in seconds),
                "p50_ms": _pct(samples, 0.50),
                "p99_ms": _pct(samples, 0.99),
            })
        return rows


def _pct(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    return round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1000, 2)


PROVIDER_EVENTS = 20_000  # per provider: bounded whatever the load


@dataclass(slots=True)
class _Served:
    at: float
    failed: bool
    ttft: float | None = None
    cost: float | None = None


class ProviderTraffic:
    """Per provider, its recent tries: answers (with their time to first token and cost) and
    failures, summarised over the last minutes for the status page."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._events: dict[str, deque[_Served]] = {}

    def _of(self, provider: str) -> deque[_Served]:
        if (found := self._events.get(provider)) is None:
            found = self._events[provider] = deque(maxlen=PROVIDER_EVENTS)
        return found

    def served(self, provider: str, ttft: float | None, cost: float | None) -> None:
        self._of(provider).append(_Served(self.clock(), False, ttft, cost))

    def failed(self, provider: str) -> None:
        self._of(provider).append(_Served(self.clock(), True))

    def retain(self, providers: set[str]) -> None:
        """Forget providers the config no longer has."""
        self._events = {p: e for p, e in self._events.items() if p in providers}

    def summary(self, provider: str, minutes: int = 5) -> dict[str, float | int | None]:
        since = self.clock() - minutes * 60
        recent = [e for e in self._events.get(provider, ()) if e.at >= since]
        answers = [e for e in recent if not e.failed]
        ttfts = sorted(e.ttft for e in answers if e.ttft is not None)
        return {"answered": len(answers), "failed": len(recent) - len(answers),
                "ttft_p50_ms": _pct(ttfts, 0.5),
                "cost_usd": round(sum(e.cost or 0.0 for e in answers), 6)}
