"""Per-key request and token limits over fixed one-minute windows.

Each request is checked against its key's limits and its team's at once, and counted against
all of them or none; what the tightest leave (`Left`) is what its answer's `x-ratelimit-*`
headers say, in OpenAI's words. Counting is local and instant; with a shared backend
(`gateway.state.redis_sync`) the local counts are flushed to Redis a few times a second and the
cluster-wide totals read back, so limits hold across processes and replicas without a Redis
round trip per request. The price is a small overshoot (at most what other replicas admitted
since the last sync), stated in the docs.
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


@dataclass(frozen=True, slots=True)
class Left:
    """What a request's per-minute limits leave in the current window: of the key's and its
    team's, the one with the fewest left, for requests and for tokens apart (pure; made by
    `RateLimiter.admit` as it counts)."""

    requests: tuple[int, int] | None  # (per minute, left after this request); None: no limit
    tokens: tuple[int, int] | None  # (per minute, left before this request's usage)
    reset: float  # seconds until the window ends and every count starts again
    refused: str | None = None  # the id of the limits used up (nothing was counted)

    def headers(self) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers: the requests triplet where a request limit
        applies, the tokens triplet where a token limit does."""
        headers = {}
        reset = duration(self.reset)
        for kind, counts in (("requests", self.requests), ("tokens", self.tokens)):
            if counts is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(counts[0])
                headers[f"x-ratelimit-remaining-{kind}"] = str(counts[1])
                headers[f"x-ratelimit-reset-{kind}"] = reset
        return headers


def duration(seconds: float) -> str:
    """Seconds as OpenAI's rate-limit headers write them (Go's durations), to the millisecond:
    `6m0s`, `1s`, `59.5s`, `1h2m3.25s`, `120ms`."""
    millis = max(0, round(seconds * 1000))
    if millis < 1000:
        return f"{millis}ms" if millis else "0s"
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, fraction = divmod(millis, 1000)
    text = f"{whole}.{fraction:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _floored(counts: tuple[int, int] | None) -> tuple[int, int] | None:
    """Nothing left is 0, however far past its limit a window's usage went."""
    return None if counts is None else (counts[0], max(0, counts[1]))


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

    def admit(self, *limits: KeyLimits | None) -> Left | None:
        """Count one request against every one of `limits` (a key's, its team's) that limits
        anything, unless one of them is used up: then nothing is counted. None when none limits
        anything (nothing is read nor counted); else what the tightest of each kind leaves."""
        limiting = [each for each in limits if each is not None
                    and (each.requests_per_minute is not None
                         or each.tokens_per_minute is not None)]
        if not limiting:
            return None
        now = self.clock()
        window = int(now // WINDOW)
        tightest: dict[str, tuple[int, int]] = {}  # kind: (per minute, left), fewest left
        refused = None
        for each in limiting:
            for kind, most in (("req", each.requests_per_minute),
                               ("tok", each.tokens_per_minute)):
                if most is None:
                    continue
                left = most - self._used(each.key_id, window, kind)
                if left <= 0 and refused is None:
                    refused = each.key_id
                if kind not in tightest or left < tightest[kind][1]:
                    tightest[kind] = (most, left)
        requests = tightest.get("req")
        if refused is None:
            for each in limiting:
                if each.requests_per_minute is not None:
                    self._add(each.key_id, window, "req", 1)
            if requests is not None:  # this request is one of them now
                requests = (requests[0], requests[1] - 1)
        return Left(_floored(requests), _floored(tightest.get("tok")),
                    (window + 1) * WINDOW - now, refused)

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
