"""The line of requests waiting for a worker, and what it has measured of its own pace.

A llama.cpp worker runs one request at a time. Refusing the third concurrent request (what the
pool did while it only counted requests sent to workers) turns six parallel clients into four
errors; Ollama and llama-server queue instead. So a request that finds every worker busy waits
here, first come first served, until a worker frees a slot or its deadline passes. The line is
bounded (`max_queue` per ready worker, counting the requests workers hold), and a request
refused because it is full is told when to come back from what `Drain` measured: how fast held
requests have been leaving, not a constant guess.

Waiting here rather than in the worker: a slot that frees on any replica serves the next in
line, a client that leaves costs nothing, and the deadline is the pool's, not a first-token
timeout firing inside a worker's own queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

W = TypeVar("W")

SMOOTHING = 0.3  # the weight of the newest measurement in each moving average


def _averaged(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass(slots=True)
class Drain:
    """How fast one model's held requests leave, as measured on an injected clock.

    The best measure is the interval between two releases while every slot was taken: the
    line's real pace. Before the pool has been saturated, Little's law gives the pace from how
    long each request held its slot; before anything finished, the oldest held request's age
    is a lower bound of that.
    """

    clock: Callable[[], float] = time.monotonic
    gap: float | None = None  # seconds between releases while saturated, averaged
    hold: float | None = None  # seconds a request held its slot, averaged
    _last_busy_release: float | None = None

    def released(self, held_for: float, saturated: bool) -> None:
        """A request left its slot after `held_for` seconds; `saturated`: every slot was taken
        (or requests were waiting) when it did."""
        now = self.clock()
        self.hold = _averaged(self.hold, held_for)
        if saturated and self._last_busy_release is not None:
            self.gap = _averaged(self.gap, now - self._last_busy_release)
        self._last_busy_release = now if saturated else None

    def expected_wait(self, ahead: int, slots: int, oldest_held: float) -> float:
        """Seconds until a request with `ahead` requests before it in line gets a slot, with
        `slots` slots serving the line and the oldest held request `oldest_held` seconds in."""
        pace = self.gap
        if pace is None:
            hold = self.hold if self.hold is not None else oldest_held
            pace = hold / max(1, slots)
        return (ahead + 1) * pace


@dataclass(eq=False, slots=True)
class _Waiter(Generic[W]):
    model: str
    since: float
    granted: asyncio.Future[W] = field(default_factory=lambda: asyncio.get_running_loop()
                                       .create_future())


class Line(Generic[W]):
    """Requests waiting for a worker, first come first served. A freed slot is handed to the
    first waiter that worker can serve (`hand`), so a newcomer cannot take it in between."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._waiters: list[_Waiter[W]] = []

    def waiting(self, model: str | None = None) -> int:
        """How many wait (for `model`, or for any)."""
        return sum(1 for w in self._waiters if model is None or w.model == model)

    def oldest(self, model: str) -> float:
        """Seconds the longest waiter for `model` has waited (0 when none waits)."""
        ages = [self.clock() - w.since for w in self._waiters if w.model == model]
        return max(ages, default=0.0)

    async def wait(self, model: str, within: float, give_back: Callable[[W], None]) -> W:
        """Wait for a worker for `model`; TimeoutError after `within` seconds, the error given
        to `close` if the line closes first. A worker granted just as the wait ends (timed out,
        or the client gone) is handed to `give_back`."""
        waiter: _Waiter[W] = _Waiter(model, self.clock())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(within):
                return await asyncio.shield(waiter.granted)
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif (waiter.granted.done() and not waiter.granted.cancelled()
                  and waiter.granted.exception() is None):
                give_back(waiter.granted.result())
            raise

    def hand(self, serves: Callable[[str], bool], take: Callable[[], W | None]) -> bool:
        """Give a worker to the first waiter whose model `serves`; `take` claims the worker's
        slot (None: none is free after all). True when someone was served."""
        for waiter in self._waiters:
            if serves(waiter.model):
                worker = take()
                if worker is None:
                    return False
                self._waiters.remove(waiter)
                waiter.granted.set_result(worker)
                return True
        return False

    def abandon(self, model: str, error: Exception) -> None:
        """Fail everyone waiting for `model` with `error` (no worker serves it any more)."""
        for waiter in [w for w in self._waiters if w.model == model]:
            self._waiters.remove(waiter)
            waiter.granted.set_exception(error)

    def close(self, error: Exception) -> None:
        """Fail every waiter with `error` (the pool is stopping)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            with contextlib.suppress(asyncio.InvalidStateError):
                waiter.granted.set_exception(error)
