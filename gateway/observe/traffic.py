"""Recent traffic for the status page: per-second counts and latency samples, ten minutes deep.

What an operator reads as "errors" is the gateway's and the providers' failures: a client's own
4xx (a bad request, a wrong key, an unknown model) is counted apart and kept out of the error
rate and the latency percentiles, where a burst of instant 401s would hide a slow provider.

So are the 503s of a healthy gateway that could not take a request yet: `not_ready` (every pool
that serves the model is still loading it) and `shed` (a full pool, or the process at its
concurrency cap). They say "wait", not "broken": a pool warming up must not read as 100% errors.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

import msgspec

from gateway.core.errors import QueueTimeout
from providers.contract.errors import ModelLoading, Overloaded, PoolFull, PoolNotReady

HORIZON = 600
SAMPLES_PER_SECOND = 128


class Refusal(Enum):
    """Why a healthy gateway or provider turned a request away: counted apart from failures."""

    NOT_READY = "not_ready"  # still loading the model
    SHED = "shed"  # busy: a full pool, the process at its concurrency cap and queue


# The try reasons (`ProviderError.reason`) that are a refusal, not a failure.
REFUSALS = {PoolNotReady.reason: Refusal.NOT_READY, ModelLoading.reason: Refusal.NOT_READY,
            PoolFull.reason: Refusal.SHED}


def refusal(reasons: Iterable[str], code: str | None = None) -> Refusal | None:
    """The refusal a failed request was, from its error `code` and its tries' `reasons`: None
    when any try truly failed (or none was made and the gateway was not shedding)."""
    if code in (Overloaded.code, QueueTimeout.code):  # busy, in the gateway's own queue
        return Refusal.SHED
    kinds = {REFUSALS.get(reason) for reason in reasons}
    if not kinds or None in kinds:
        return None
    return Refusal.NOT_READY if Refusal.NOT_READY in kinds else Refusal.SHED


@dataclass(slots=True)
class _Second:
    at: int
    requests: int = 0
    errors: int = 0
    client_errors: int = 0
    not_ready: int = 0
    shed: int = 0
    cache_hits: int = 0
    hedges: int = 0
    latencies: list[float] = field(default_factory=list)


class RecentTraffic:
    """Bounded memory whatever the load: a ring of seconds, each with a latency reservoir."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._seconds: deque[_Second] = deque(maxlen=HORIZON)
        self._rng = random.Random(0)

    def add(self, duration: float, ok: bool, client_error: bool = False,
            cache_hit: bool = False, hedged: bool = False,
            refused: Refusal | None = None) -> None:
        """One finished request: a success, a failure, the client's own 4xx, or a refusal."""
        now, seconds = int(self.clock()), self._seconds
        if not seconds or (second := seconds[-1]).at != now:
            second = _Second(now)
            seconds.append(second)
        if cache_hit:  # each count touched only when it moves: a request moves few of them
            second.cache_hits += 1
        if hedged:
            second.hedges += 1
        if client_error:
            second.client_errors += 1
            return
        if refused is not None:
            if refused is Refusal.NOT_READY:
                second.not_ready += 1
            else:
                second.shed += 1
            return
        second.requests += 1  # also the requests the reservoir has seen
        if not ok:
            second.errors += 1
        latencies = second.latencies
        if len(latencies) < SAMPLES_PER_SECOND:
            latencies.append(duration)
        elif (slot := int(self._rng.random() * second.requests)) < SAMPLES_PER_SECOND:
            latencies[slot] = duration  # reservoir sampling keeps it uniform

    def series(self, minutes: int = 5, step: int = 10) -> list[dict[str, float | int | None]]:
        """Bins of `step` seconds over the last `minutes`: rate, error rate, p50 and p99 (ms),
        and the requests counted apart (client errors, not ready, shed)."""
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
                "not_ready": sum(s.not_ready for s in seconds),
                "shed": sum(s.shed for s in seconds),
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


class _Served(msgspec.Struct, gc=False):  # made per request: a Struct's init is C's own
    at: float
    failed: bool
    refused: Refusal | None = None
    ttft: float | None = None
    cost: float | None = None


class ProviderTraffic:
    """Per provider, its recent tries: answers (with their time to first token and cost),
    failures and refusals (not ready, shed), summarised over the last minutes for the status
    page."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._events: dict[str, deque[_Served]] = {}

    def _of(self, provider: str) -> deque[_Served]:
        if (found := self._events.get(provider)) is None:
            found = self._events[provider] = deque(maxlen=PROVIDER_EVENTS)
        return found

    def served(self, provider: str, ttft: float | None, cost: float | None) -> None:
        """A try at `provider` answered."""
        if (events := self._events.get(provider)) is None:
            events = self._of(provider)
        events.append(_Served(self.clock(), False, None, ttft, cost))

    def failed(self, provider: str, reason: str) -> None:
        """A try at `provider` failed for `reason` (`ProviderError.reason`): a refusal when the
        provider was loading or full, else a failure."""
        self._of(provider).append(_Served(self.clock(), True, REFUSALS.get(reason)))

    def retain(self, providers: set[str]) -> None:
        """Forget providers the config no longer has."""
        self._events = {p: e for p, e in self._events.items() if p in providers}

    def summary(self, provider: str, minutes: int = 5) -> dict[str, float | int | None]:
        """The last `minutes` of `provider`: tries answered, failed, not ready and shed, the
        answers' median time to first token and their cost."""
        since = self.clock() - minutes * 60
        recent = [e for e in self._events.get(provider, ()) if e.at >= since]
        answers = [e for e in recent if not e.failed]
        ttfts = sorted(e.ttft for e in answers if e.ttft is not None)
        refused = [e.refused for e in recent if e.refused is not None]
        not_ready = refused.count(Refusal.NOT_READY)
        return {"answered": len(answers),
                "failed": len(recent) - len(answers) - len(refused),
                "not_ready": not_ready, "shed": len(refused) - not_ready,
                "ttft_p50_ms": _pct(ttfts, 0.5),
                "cost_usd": round(sum(e.cost or 0.0 for e in answers), 6)}
