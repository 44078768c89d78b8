"""The time limits of one upstream exchange, and the watchdog that enforces them on a stream.

First token and total run from the exchange's start, idle per gap between data events; a stream
that stalls fails its pending read with the timeout that names what stalled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Protocol

from providers.contract.errors import (
    FirstTokenTimeout,
    IdleTimeout,
    ProviderTimeout,
    TotalTimeout,
)
from providers.contract.spec import Timeouts
from providers.wire.expiry import Expiry

TimeoutKind = type[ProviderTimeout]
DATA = b"data:"  # what starts a server-sent event's data: progress in an SSE stream
EVERY_CHUNK = b""  # a binary answer's mark (audio): every chunk is progress


class Deadline:
    """The time budget of one exchange: first token and total from its start, idle per gap."""

    __slots__ = ("_loop", "first_token_at", "idle", "total_at")

    def __init__(self, timeouts: Timeouts) -> None:
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self.first_token_at = now + timeouts.first_token
        self.total_at = now + timeouts.total
        self.idle = timeouts.idle

    def first_token(self) -> tuple[float, type[ProviderTimeout]]:
        """Seconds left for headers and the first chunk, and the error that names what fired."""
        return self._until(self.first_token_at, FirstTokenTimeout)

    def next_chunk(self) -> tuple[float, type[ProviderTimeout]]:
        """Seconds allowed for the next chunk."""
        return self._until(self._loop.time() + self.idle, IdleTimeout)

    def capped(self, at: float, error: TimeoutKind) -> tuple[float, TimeoutKind]:
        """A phase's end `at`, unless the total limit comes first (then that, named so)."""
        if self.total_at <= at:
            return self.total_at, TotalTimeout
        return at, error

    def _until(self, at: float, error: TimeoutKind) -> tuple[float, TimeoutKind]:
        at, error = self.capped(at, error)
        return max(0.0, at - self._loop.time()), error


class Body(Protocol):
    """A body read as it arrives (`HttpResponse`): what the stream timeouts act on."""

    def readany(self) -> Awaitable[bytes]: ...

    def set_exception(self, exc: BaseException) -> None: ...


async def read_stream(response: Body, deadline: Deadline, progress: bytes = DATA
                      ) -> AsyncIterator[bytes]:
    """Yield the body as it arrives, enforcing first-token, idle and total timeouts; a chunk
    with `progress` in it is progress."""
    watchdog = Watchdog(response, deadline, progress)
    try:
        while chunk := await response.readany():
            watchdog.got_chunk(chunk)
            yield chunk
            watchdog.waiting()
    finally:
        watchdog.stop()


class Watchdog:
    """Fails a stream's pending read with the timeout that names what stalled.

    Only data events count as progress: an SSE comment (`: ping`) or a line trickled a byte at
    a time proves nothing, so neither stops the first-token clock nor restarts the idle one.
    One timer per stream, re-armed only when it fires, or when the idle limit ends before the
    first token's would: a timeout around each read cost a timer and a context manager per
    chunk, ~10% of the gateway's work per chunk. The idle clock runs only while the gateway
    waits on the upstream, not while the client is slow to take a chunk.

    Made with no `reader`, it keeps the first-token limit on the answer's head too: the task
    awaiting the head is cancelled (`lapsed` tells that cancellation apart), until `opened`
    hands it the body; one timer for both, where `asyncio.timeout` around the head cost a
    second timer and its context manager's state.
    """

    __slots__ = ("_deadline", "_handle", "_idle_from", "_loop", "_opening", "_progress",
                 "_reader", "_started", "_tail", "_waiting")

    def __init__(self, reader: Body | None, deadline: Deadline, progress: bytes = DATA) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = reader
        self._deadline = deadline
        self._started = False  # no data event yet: the first-token limit applies
        self._waiting = True
        self._idle_from: float | None = None  # since the last data event, once waiting again
        self._progress = progress  # the mark of a data event (another framing has its own)
        self._tail = b""  # the end of the last chunk: the mark may straddle two
        due = self._due()[0]
        # While the head is awaited: the cancellation of the task awaiting it, when it is due.
        self._opening: Expiry | None = None
        if reader is None:
            task = asyncio.current_task()
            assert task is not None, "awaited in a task"
            self._opening = Expiry(task, due)
        self._handle = self._loop.call_at(due, self._check)

    def opened(self, reader: Body) -> None:
        """The answer's head came: from now the timer fails `reader`'s pending read."""
        self._reader = reader
        self._opening = None

    def lapsed(self) -> bool:
        """Called on a `CancelledError` while the head was awaited: whether it is the
        first-token limit's own (then taken back), not one asked from elsewhere as well."""
        return self._opening is not None and self._opening.lapsed()

    def got_chunk(self, chunk: bytes) -> None:
        self._waiting = False
        seen = self._tail + chunk if self._tail else chunk
        self._tail = chunk[1 - len(self._progress):]
        if seen.find(self._progress) < 0:  # not `in`: see `sse.Reader.data`
            return
        self._idle_from = None
        if not self._started:  # from the first-token limit to the idle one
            self._started = True
            due = self._due()[0]
            if due < self._handle.when():  # else `_check` re-arms it when it fires
                self._handle.cancel()
                self._handle = self._loop.call_at(due, self._check)

    def waiting(self) -> None:
        now = self._loop.time()
        self._waiting = True
        if self._idle_from is None:
            self._idle_from = now
        if now >= self._deadline.total_at:
            self._expire(TotalTimeout)

    def stop(self) -> None:
        self._handle.cancel()

    def _due(self) -> tuple[float, TimeoutKind]:
        deadline = self._deadline
        if not self._started:
            return deadline.capped(deadline.first_token_at, FirstTokenTimeout)
        since = self._loop.time() if self._idle_from is None else self._idle_from
        return deadline.capped(since + deadline.idle, IdleTimeout)

    def _check(self) -> None:
        at, error = self._due()
        now = self._loop.time()
        if self._waiting and now >= at:
            self._expire(error)
            return
        self._handle = self._loop.call_at(max(at, now + 0.001), self._check)

    def _expire(self, error: TimeoutKind) -> None:
        if self._opening is not None:
            self._opening.expire()
        elif self._reader is not None:
            self._reader.set_exception(error(f"no data within {error.reason.replace('_', ' ')} "
                                             "limit"))
