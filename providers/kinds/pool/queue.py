"""The line of requests waiting for a worker, and what it has measured of its own pace.

A llama.cpp worker runs one request at a time. Refusing the third concurrent request (what the
pool did while it only counted requests sent to workers) turns six parallel clients into four
errors; Ollama and llama-server queue instead. So a request that finds every worker busy waits
here, the highest priority first and first come first served within one (`x-llms-priority`, as
the gateway's own queue orders a key's requests), until a worker frees a slot or its deadline
passes. The line is
bounded (`max_queue` per ready worker, counting the requests workers hold), and a request
refused because it is full is told when to come back from what `Pace` measured
(`providers.contract.pace`): how fast held requests have been leaving, not a constant guess.

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


@dataclass(eq=False, slots=True)
class _Waiter(Generic[W]):
    model: str
    since: float
    priority: int
    granted: asyncio.Future[W] = field(default_factory=lambda: asyncio.get_running_loop()
                                       .create_future())


class Line(Generic[W]):
    """Requests waiting for a worker, the highest priority first, then first come first
    served. A freed slot is handed to the first such waiter that worker can serve (`hand`), so a
    newcomer cannot take it in between."""

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

    async def wait(self, model: str, within: float, give_back: Callable[[W], None],
                   priority: int = 0) -> W:
        """Wait for a worker for `model`, ahead of waiters of a lower `priority`; TimeoutError
        after `within` seconds, the error given to `close` if the line closes first. A worker
        granted just as the wait ends (timed out, or the client gone) is handed to
        `give_back`."""
        waiter: _Waiter[W] = _Waiter(model, self.clock(), priority)
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
        """Give a worker to the waiter of the highest priority whose model `serves`, the
        first come among equals; `take` claims the worker's slot (None: none is free after
        all). True when someone was served."""
        chosen: _Waiter[W] | None = None
        for waiter in self._waiters:  # in arrival order: a tie keeps the first come
            if serves(waiter.model) and (chosen is None or waiter.priority > chosen.priority):
                chosen = waiter
        if chosen is None:
            return False
        worker = take()
        if worker is None:
            return False
        self._waiters.remove(chosen)
        chosen.granted.set_result(worker)
        return True

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
