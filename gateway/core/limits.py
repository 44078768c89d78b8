"""Per-key request and token limits over fixed one-minute windows.

Counting is local and instant; with a shared backend (`gateway.state.redis_sync`) the local counts
are flushed to Redis a few times a second and the cluster-wide totals read back, so limits hold
across processes and replicas without a Redis round trip per request. The price is a small
overshoot (at most what other replicas admitted since the last sync), stated in the docs.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

WINDOW = 60
PRIORITY_BOUND = 1_000_000  # the largest priority's magnitude, in a key entry or a header


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """What one gateway key may use per minute (None: unlimited), and how its requests wait
    in the queue at the concurrency cap (`gateway.queue.queueing`)."""

    key_id: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    priority: int = 0  # without `x-llms-priority`
    max_priority: int = 0  # the most `x-llms-priority` may ask for
    timeout: float | None = None  # seconds in the queue without `x-llms-timeout`
    weight: int = 1  # requests started per turn between keys


class RateLimiter:
    """Request and token counts per (key, minute), local plus what other processes reported."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.local: dict[tuple[str, int, str], int] = defaultdict(int)
        self.pending: dict[tuple[str, int, str], int] = defaultdict(int)
        self.remote: dict[tuple[str, int, str], int] = {}

    def _used(self, key_id: str, window: int, kind: str) -> int:
        counted = (key_id, window, kind)
        if counted in self.remote:  # the cluster's total at the last sync, plus ours since
            return self.remote[counted] + self.pending.get(counted, 0)
        return self.local.get(counted, 0)

    def admit(self, limits: KeyLimits) -> float | None:
        """Count one request; None if allowed, else seconds until the window resets."""
        now = self.clock()
        window = int(now // WINDOW)
        wait = (window + 1) * WINDOW - now
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        if rpm is not None and self._used(limits.key_id, window, "req") >= rpm:
            return wait
        if tpm is not None and self._used(limits.key_id, window, "tok") >= tpm:
            return wait
        self._add(limits.key_id, window, "req", 1)
        return None

    def spend_tokens(self, key_id: str, tokens: int) -> None:
        """Count tokens a request used (from its `usage`), against the current window."""
        if tokens > 0:
            self._add(key_id, int(self.clock() // WINDOW), "tok", tokens)

    def _add(self, key_id: str, window: int, kind: str, amount: int) -> None:
        self.local[(key_id, window, kind)] += amount
        self.pending[(key_id, window, kind)] += amount
        self._forget_before(window)

    def take_pending(self) -> dict[tuple[str, int, str], int]:
        """The counts not yet shared; the caller gives them back with `restore` on failure."""
        pending, self.pending = dict(self.pending), defaultdict(int)
        return pending

    def restore(self, pending: dict[tuple[str, int, str], int]) -> None:
        for counted, amount in pending.items():
            self.pending[counted] += amount

    def apply_totals(self, totals: dict[tuple[str, int, str], int]) -> None:
        """Cluster-wide totals, as Redis returned them after our increments."""
        self.remote.update(totals)

    def _forget_before(self, window: int) -> None:
        if len(self.local) > 4096:  # bounded: drop windows that can no longer matter
            for table in (self.local, self.remote):
                for counted in [c for c in table if c[1] < window]:
                    del table[counted]
