"""One timer for many deadlines (`Sweep`), and whole answers' total timeouts kept by it.

A timer made and cancelled for each of many short waits (a request's body, its disconnect guard,
a whole answer's total) cost more than the work around it. So the waits of one kind share one
timer that looks them over every `interval` and runs only while some wait: a wait ends that much
late at most.

`asyncio.timeout` around every whole answer also read its state enum several times (on Python
3.11 each read of an enum member goes through `EnumType.__getattr__`'s attribute hook). A total
is seconds to minutes, so `Expiries` looks over every answer in flight a tenth of the total apart
(at most a second), and tells its cancellation apart from any other exactly as `asyncio.timeout`
does (`Expiry.lapsed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Due(Protocol):
    """A wait a `Sweep` looks over: the loop time it is due at."""

    @property
    def due(self) -> float: ...


W = TypeVar("W", bound=Due)


class Sweep(Generic[W]):
    """Waits each due at a time, looked over every `interval` seconds by one timer that runs
    only while some wait; each that is due is taken out and handed to `act`."""

    __slots__ = ("act", "handle", "interval", "waiting")

    def __init__(self, interval: float, act: Callable[[W], None]) -> None:
        self.interval = interval
        self.act = act
        self.waiting: set[W] = set()
        self.handle: asyncio.TimerHandle | None = None

    def add(self, waiter: W) -> None:
        """Look `waiter` over until it is due or `discard`ed."""
        self.waiting.add(waiter)
        if self.handle is None:
            self.handle = asyncio.get_running_loop().call_later(self.interval, self.sweep)

    def discard(self, waiter: W) -> None:
        """Stop looking `waiter` over."""
        self.waiting.discard(waiter)

    def sweep(self) -> None:
        """Act on every wait that is due; come back while any are left."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for waiter in [w for w in self.waiting if w.due <= now]:
            self.waiting.discard(waiter)
            self.act(waiter)
        self.handle = loop.call_later(self.interval, self.sweep) if self.waiting else None


class Expiry:
    """One awaited answer's total: its task is cancelled once `due` has passed."""

    __slots__ = ("cancelling", "due", "expired", "task")

    def __init__(self, task: asyncio.Task[object], due: float) -> None:
        self.task = task
        self.due = due
        self.cancelling = task.cancelling()  # cancellations already asked before it began
        self.expired = False

    def expire(self) -> None:
        """The total has passed: cancel the task awaiting the answer."""
        self.expired = True
        self.task.cancel()

    def lapsed(self) -> bool:
        """Called on a `CancelledError`: whether it is this expiry's own (then taken back, so
        the task runs on), not one asked from elsewhere as well."""
        return self.expired and self.task.uncancel() <= self.cancelling


class Expiries:
    """The answers awaited against a `total` of seconds, one `Sweep` for them all."""

    __slots__ = ("timer", "total")

    def __init__(self, total: float) -> None:
        self.total = total
        self.timer: Sweep[Expiry] = Sweep(min(1.0, total / 10), Expiry.expire)

    def start(self) -> Expiry:
        """The current task's answer, due within `total` from now: `end` it however it ends."""
        task = asyncio.current_task()
        assert task is not None, "awaited in a task"
        expiry = Expiry(task, asyncio.get_running_loop().time() + self.total)
        self.timer.add(expiry)
        return expiry

    def end(self, expiry: Expiry) -> None:
        """The answer is in, or failed: no cancel for it any more."""
        self.timer.discard(expiry)
