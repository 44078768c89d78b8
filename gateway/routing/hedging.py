"""Hedging that learns its delay and budgets itself: how long the router waits on a candidate
before starting the next one beside it, and whether one more hedge fits the alias's budget.

`routing.hedge_after` is a number of seconds, or a quantile (`"p90"`) of the leading
candidate's recent times to first token, learned per (alias, provider) from its last `SAMPLES`
answered tries no older than `MAX_AGE` seconds. Until `MIN_SAMPLES` of them are there, the
delay is `FALLBACK` seconds. Quantiles are interpolated between the two nearest samples
(numpy's default), so with 10 % slow tries the p90 falls between the fast and the slow ones
rather than on either. A leader that lost the race to its hedge is kept as a sample of the
time it had taken when it lost: a lower bound, but above the delay, so the quantile still
counts it as slow (dropped, the slow ones would vanish from the window and the delay shrink
until everything is hedged).

`routing.hedge_budget` bounds hedges to a share of the alias's requests over its last
`BUDGET_WINDOW` requests: when one more hedge would exceed the share, none starts and the
request waits on its first candidate. The window counts requests, not seconds: a quiet alias
keeps its budget (a time window would never allow a quiet alias one hedge), and what it allows
is exact: with 0.05, one hedge per 20 requests, the first at the 20th.

`routing.hedge_min` is the budget's floor: however few requests the alias had, a hedge may
start while fewer than that many started in the last `FLOOR_WINDOW` seconds (a time window,
on the injected clock). Without it a quiet alias would never hedge (its 20th request is a long
way off), so a user who sets `hedge_after` would see none; Envoy's retry budgets keep the same
floor (`min_retry_concurrency`). Hedges the floor allows count in the budget's window too.

Plain code over an injected clock; `Hedging` keeps one `AliasHedging` per alias on the runtime
(so it survives reloads), read by the router, `/status.json` and `/metrics`.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from gateway.core.settings import quantile

# The recent tries a quantile is read from, per (alias, provider), and how old one may be: a
# provider's speed an hour ago is not its speed now.
SAMPLES = 200
MAX_AGE = 600.0
# Fewer samples than this say too little about a tail (2 of 20 above a p90): the fallback then.
MIN_SAMPLES = 20
# The delay until enough samples exist: longer than most first tokens of hosted models, so
# learning hedges little; the budget bounds it anyway.
FALLBACK = 2.0
# The budget's window: the alias's last 900 to 1,000 requests, in buckets of 100 dropped whole.
BUDGET_WINDOW = 1000
BUCKETS = 10
# The floor's window: `hedge_min` hedges per minute, whatever the budget says.
FLOOR_WINDOW = 60.0
# `"p90"`, `"p99.9"`: a percentile in the form latency dashboards write it.


def interpolated(ordered: list[float], q: float) -> float:
    """The `q` quantile of the sorted, non-empty `ordered`, linear between the nearest two."""
    at = q * (len(ordered) - 1)
    below = math.floor(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)


class Samples:
    """One (alias, provider)'s recent times to first token: the last `SAMPLES`, none older than
    `MAX_AGE` seconds, kept in arrival order and sorted (each sample goes in and out of the
    sorted list by bisection: a quantile is then a lookup, not a sort per request)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._kept: deque[tuple[float, float]] = deque()  # (when, seconds), oldest first
        self._sorted: list[float] = []

    def add(self, seconds: float) -> None:
        if len(self._kept) >= SAMPLES:
            self._drop()
        self._kept.append((self._clock(), seconds))
        bisect.insort(self._sorted, seconds)

    def quantile(self, q: float) -> float | None:
        """The `q` quantile of the window; None with fewer than `MIN_SAMPLES` in it."""
        self._expire()
        if len(self._kept) < MIN_SAMPLES:
            return None
        return interpolated(self._sorted, q)

    def __len__(self) -> int:
        self._expire()
        return len(self._kept)

    def _expire(self) -> None:
        oldest = self._clock() - MAX_AGE
        while self._kept and self._kept[0][0] < oldest:
            self._drop()

    def _drop(self) -> None:
        _, seconds = self._kept.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, seconds)]


class Budget:
    """One alias's hedges against its requests over its last `BUDGET_WINDOW` requests, kept in
    `BUCKETS` buckets ([requests, hedges]); the oldest is dropped whole when a new one starts.
    A hedge counts in the bucket current when it starts, which is near its request's. Below
    the share, `floor` hedges per `FLOOR_WINDOW` seconds are allowed all the same."""

    def __init__(self, share: float, floor: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.share = share
        self.floor = floor
        self._clock = clock
        self._buckets: deque[list[int]] = deque([[0, 0]], maxlen=BUCKETS)
        self._recent: deque[float] = deque()  # when the hedges of the floor's window started
        self.refused = 0  # hedges the budget stopped, since the process started

    def requested(self) -> None:
        """A request of the alias started."""
        if self._buckets[-1][0] >= BUDGET_WINDOW // BUCKETS:
            self._buckets.append([0, 0])
        self._buckets[-1][0] += 1

    def spend(self) -> bool:
        """Whether one more hedge fits the share, or the floor, counted if so."""
        requests, hedges = self.totals()
        # The tolerance: 0.05 * 20 requests must allow its one hedge despite binary fractions.
        if hedges + 1 > self.share * requests + 1e-9 and self.last_minute() >= self.floor:
            self.refused += 1
            return False
        self._buckets[-1][1] += 1
        self._recent.append(self._clock())
        return True

    def last_minute(self) -> int:
        """Hedges started in the floor's window (`FLOOR_WINDOW` seconds)."""
        oldest = self._clock() - FLOOR_WINDOW
        recent = self._recent
        while recent and recent[0] <= oldest:
            recent.popleft()
        return len(recent)

    def totals(self) -> tuple[int, int]:
        """Requests and hedges in the window."""
        return (sum(bucket[0] for bucket in self._buckets),
                sum(bucket[1] for bucket in self._buckets))

    def used(self) -> float:
        """The share of the window's requests that were hedged."""
        requests, hedges = self.totals()
        return hedges / requests if requests else 0.0


class AliasHedging:
    """One alias's hedging: its delay when each provider leads, its budget."""

    def __init__(self, after: float | str, share: float, floor: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: dict[str, Samples] = {}
        self.budget = Budget(share, floor, clock)
        self.after = after
        self._q: float | None = None
        self.configure(after, share, floor)

    def configure(self, after: float | str, share: float, floor: int = 0) -> None:
        """Take a reloaded `hedge_after`, `hedge_budget` and `hedge_min`; what was learned is
        kept."""
        self.after = after
        self._q = quantile(after) if isinstance(after, str) else None
        self.budget.share = share
        self.budget.floor = floor

    def delay(self, provider: str) -> float:
        """Seconds to wait on `provider`, leading, before the hedge may start."""
        if self._q is None:
            return float(self.after)
        learned = self._of(provider).quantile(self._q)
        return FALLBACK if learned is None else learned

    def observe(self, provider: str, seconds: float) -> None:
        """A try at `provider` answered (its first token) after `seconds`, or lost a hedge
        race after that long without answering."""
        self._of(provider).add(seconds)

    def requested(self) -> None:
        """A request of the alias started: it widens the budget by the share."""
        self.budget.requested()

    def spend(self) -> bool:
        """Whether a hedge may start now (counted if so): within the budget."""
        return self.budget.spend()

    def view(self) -> dict[str, Any]:
        """The configured forms, the delay per provider seen so far, and the budget used."""
        requests, hedges = self.budget.totals()
        return {
            "hedge_after": self.after,
            "hedge_budget": self.budget.share,
            "hedge_min": self.budget.floor,
            "budget_used": round(self.budget.used(), 4),
            "last_minute": self.budget.last_minute(),
            "requests": requests,
            "hedges": hedges,
            "over_budget": self.budget.refused,
            "delays": [{"provider": provider, "delay_s": round(self.delay(provider), 4),
                        "samples": len(samples),
                        "learned": self._q is not None and len(samples) >= MIN_SAMPLES}
                       for provider, samples in self._samples.items()],
        }

    def _of(self, provider: str) -> Samples:
        found = self._samples.get(provider)
        if found is None:
            found = self._samples[provider] = Samples(self._clock)
        return found

    def retain(self, providers: set[str]) -> None:
        self._samples = {p: s for p, s in self._samples.items() if p in providers}


class Hedging:
    """Every alias's hedging, for the process's life."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.aliases: dict[str, AliasHedging] = {}

    def of(self, alias: str, after: float | str | None, share: float, floor: int = 0
           ) -> AliasHedging | None:
        """`alias`'s hedging as the live config sets it; None when it does not hedge."""
        if after is None:
            self.aliases.pop(alias, None)  # a reload turned it off: no longer shown
            return None
        found = self.aliases.get(alias)
        if found is None:
            found = self.aliases[alias] = AliasHedging(after, share, floor, self._clock)
        elif found.after != after or found.budget.share != share \
                or found.budget.floor != floor:
            found.configure(after, share, floor)
        return found

    def retain(self, served: Iterable[tuple[str, str]]) -> None:
        """Forget aliases and providers the config no longer routes (pairs alias, provider)."""
        providers: dict[str, set[str]] = {}
        for alias, provider in served:
            providers.setdefault(alias, set()).add(provider)
        self.aliases = {a: h for a, h in self.aliases.items() if a in providers}
        for alias, hedging in self.aliases.items():
            hedging.retain(providers[alias])

    def view(self) -> dict[str, dict[str, Any]]:
        """Per alias that hedges, what `/status.json` shows."""
        return {alias: hedging.view() for alias, hedging in self.aliases.items()}
