"""Whole answers' total timeouts, kept by one timer per upstream.

`asyncio.timeout` around every whole answer made a timer of its own and read its state enum several
times (on Python 3.11 each read of an enum member goes through `EnumType.__getattr__`'s attribute
hook): a sizeable share of a plain request's own work. A total is seconds to minutes, so one timer
looks over every answer in flight, a tenth of the total apart (at most a second): an answer is cut
that much late at most. The cancellation is told apart from any other exactly as
`asyncio.timeout` tells it (`Expiry.lapsed`).
"""

from __future__ import annotations

import asyncio


class Expiry:
    """One awaited answer's total: its task is cancelled once `due` has passed."""

    __slots__ = ("cancelling", "due", "expired", "task")

    def __init__(self, task: asyncio.Task[object], due: float) -> None:
        self.task = task
        self.due = due
        self.cancelling = task.cancelling()  # cancellations already asked before it began
        self.expired = False

    def lapsed(self) -> bool:
        """Called on a `CancelledError`: whether it is this expiry's own (then taken back, so
        the task runs on), not one asked from elsewhere as well."""
        return self.expired and self.task.uncancel() <= self.cancelling


class Expiries:
    """The answers awaited against a `total` of seconds, swept by one timer that runs only while
    some are awaited."""

    __slots__ = ("handle", "interval", "total", "waiting")

    def __init__(self, total: float) -> None:
        self.total = total
        self.interval = min(1.0, total / 10)
        self.waiting: set[Expiry] = set()
        self.handle: asyncio.TimerHandle | None = None

    def start(self) -> Expiry:
        """The current task's answer, due within `total` from now: `end` it however it ends."""
        task = asyncio.current_task()
        assert task is not None, "awaited in a task"
        loop = asyncio.get_running_loop()
        expiry = Expiry(task, loop.time() + self.total)
        self.waiting.add(expiry)
        if self.handle is None:
            self.handle = loop.call_later(self.interval, self.sweep)
        return expiry

    def end(self, expiry: Expiry) -> None:
        """The answer is in, or failed: no cancel for it any more."""
        self.waiting.discard(expiry)

    def sweep(self) -> None:
        """Cancel every task whose answer is past due; come back while any are awaited."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for expiry in [e for e in self.waiting if e.due <= now]:
            self.waiting.discard(expiry)
            expiry.expired = True
            expiry.task.cancel()
        self.handle = loop.call_later(self.interval, self.sweep) if self.waiting else None
