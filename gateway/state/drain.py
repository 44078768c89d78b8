"""A worker's shutdown, as its open streams see it.

On SIGTERM the server stops accepting connections and lets open requests finish; a stream
longer than that would be cut when the server's patience ends, and its client could not tell
a cut from an answer that stopped. So after `server.drain_timeout` seconds the streams still
open are ended by the gateway itself: each gets the in-band error event, then its end.

The server owns SIGTERM; the drain only listens: it chains onto the handler in place (with the
standard library's `signal.signal`), which still runs, so the server's own shutdown is unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

from gateway.core.record import Outcome, Record
from providers.contract.log import get_logger


class Drain:
    """Tracks the open streams and ends them `timeout` seconds after SIGTERM."""

    def __init__(self) -> None:
        # Each open stream's task, and its request's record (ended here if the drain cuts it).
        self._streams: dict[asyncio.Task[Any], Record | None] = {}
        self._cut: set[asyncio.Task[Any]] = set()

    def listen(self, timeout: float) -> None:
        """Hear SIGTERM in this process, after the handler already in place."""
        loop = asyncio.get_running_loop()
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except ValueError:
            return

        def heard(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(self._begin, timeout)
            if callable(previous):
                previous(signum, frame)
            elif previous in (signal.SIG_DFL, None):  # nobody else listens: die as before
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        with contextlib.suppress(ValueError):  # not the main thread: no signals to hear
            signal.signal(signal.SIGTERM, heard)

    def _begin(self, timeout: float) -> None:
        get_logger().info("shutdown_draining", open_streams=len(self._streams),
                          cut_after_s=timeout)
        asyncio.get_running_loop().call_later(timeout, self.cut_all)

    def cut_all(self) -> None:
        """End every open stream now (each sends its in-band error)."""
        if self._streams:
            get_logger().warning("shutdown_cutting_streams", open_streams=len(self._streams),
                                 reason="still open when the drain time ran out")
        for task, record in self._streams.items():
            if record is not None:
                record.end(Outcome.ERROR, reason="shutdown")
            self._cut.add(task)
            task.cancel()

    @contextlib.contextmanager
    def tracking(self, record: Record | None = None) -> Iterator[None]:
        """Count the current task's stream as open while in this block; its `record` ends as
        an error if the drain cuts it."""
        task = asyncio.current_task()
        assert task is not None
        self._streams[task] = record
        try:
            yield
        finally:
            self._streams.pop(task, None)

    def was_cut(self) -> bool:
        """Whether the current task's cancellation is the drain's (then it is taken back)."""
        task = asyncio.current_task()
        if task is None or task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True
