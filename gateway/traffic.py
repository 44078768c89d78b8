"""Recent traffic for the status page: per-second counts and latency samples, ten minutes deep."""

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
    seen: int = 0
    latencies: list[float] = field(default_factory=list)


class RecentTraffic:
    """Bounded memory whatever the load: a ring of seconds, each with a latency reservoir."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._seconds: deque[_Second] = deque(maxlen=HORIZON)
        self._rng = random.Random(0)

    def add(self, duration: float, ok: bool) -> None:
        now = int(self.clock())
        if not self._seconds or self._seconds[-1].at != now:
            self._seconds.append(_Second(now))
        second = self._seconds[-1]
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
                "p50_ms": _pct(samples, 0.50),
                "p99_ms": _pct(samples, 0.99),
            })
        return rows


def _pct(samples: list[float], q: float) -> float | None:
    if not samples:
        return None
    return round(samples[min(len(samples) - 1, int(q * len(samples)))] * 1000, 2)
