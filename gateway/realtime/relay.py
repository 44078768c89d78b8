"""The session's relay: frames both ways as they are, one at a time, within the session's bounds.

Two pumps, one per direction, each reading one frame, sending it, and waiting for the send to be
taken before it reads the next: a slow reader on either side slows the other side's sender and
never grows a queue here (aiohttp stops reading the upstream's socket while its own frames are
unread; the client's frames wait in the server's socket buffer). Frames are relayed as they
came, never re-encoded; only the upstream's events are read, for their `type` (`response.done`
is told to `Watch`, which prices it; an `error` event's text is redacted). The session ends at
the first of: either side closing, a frame over `realtime.max_frame_bytes` (1009), no frame
either way for `realtime.idle_timeout` or the session reaching `realtime.max_session_seconds`
(an `error` event, then 1008), a budget spent (`error` with `budget_exceeded`, then 1008), or
the upstream dropping (1011, its reason said).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from gateway.core.record import Outcome
from gateway.core.settings.realtime import RealtimeConfig
from gateway.realtime.usage import EVENT, Event
from providers.contract.errors import GatewayError, ProviderError
from providers.contract.redact import Redactor
from providers.contract.transport import UpstreamSocket

NORMAL, GOING_AWAY, POLICY, TOO_BIG, INTERNAL, TRY_LATER = 1000, 1001, 1008, 1009, 1011, 1013


class ClientGone(Exception):
    """The client's socket is closed: nothing more can be sent to it."""


class ClientSocket(Protocol):
    """The client's WebSocket as the edge hands it over: frames as they are."""

    async def accept(self, subprotocol: str | None, headers: dict[str, str]) -> None: ...

    async def receive(self) -> str | bytes | None:
        """The next frame; None once the client closed."""
        ...

    async def send(self, frame: str | bytes) -> None:
        """One frame; ClientGone once the client closed."""
        ...

    async def close(self, code: int, reason: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Ending:
    """How a session ended: the close code and reason the client gets, the record's outcome,
    and the error event sent before the close, if any."""

    code: int
    reason: str
    outcome: Outcome
    error: GatewayError | None = None


# What a priced `response.done` may decide: the session goes on (None), or ends so.
Watch = Callable[[Event], Awaitable[Ending | None]]


def error_event(error: GatewayError) -> str:
    """The Realtime API's `error` server event for `error`."""
    return msgspec.json.encode({"type": "error", "event_id": None, "error": {
        "type": error.error_type, "code": error.code, "message": error.message,
        "param": error.param, "event_id": None}}).decode()


class SessionExpired(GatewayError):
    """The session reached `realtime.max_session_seconds`: it is ended."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "session_expired"


class SessionIdle(SessionExpired):
    """No frame either way for `realtime.idle_timeout`: the session is ended."""

    code = "session_idle_timeout"


@dataclass(slots=True)
class Counts:
    """Frames and bytes relayed each way."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


class Relay:
    """One session's relay between `client` and `upstream`."""

    def __init__(self, client: ClientSocket, upstream: UpstreamSocket, limits: RealtimeConfig,
                 watch: Watch, redactor: Redactor,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.upstream, self.limits = client, upstream, limits
        self.watch, self.redactor, self.clock = watch, redactor, clock
        self.counts = Counts()
        self.last = self.started = clock()

    async def run(self) -> Ending:
        """Relay until the session ends; the client is sent its error event, if any, and
        closed, and the upstream closed, however it ended."""
        pumps = {asyncio.create_task(self._up()), asyncio.create_task(self._down())}
        try:
            ending = await self._until_ended(pumps)
        finally:
            for pump in pumps:
                pump.cancel()
            for pump in pumps:
                with contextlib.suppress(BaseException):
                    await pump
            await self.upstream.close()
        if ending.error is not None:
            with contextlib.suppress(ClientGone):
                await self.client.send(error_event(ending.error))
        await self.client.close(ending.code, ending.reason)
        return ending

    async def _until_ended(self, pumps: set[asyncio.Task[Ending]]) -> Ending:
        limits = self.limits
        while True:
            now = self.clock()
            idle = self.last + limits.idle_timeout - now
            left = self.started + limits.max_session_seconds - now
            if left <= 0:
                return Ending(POLICY, "session length limit reached", Outcome.COMPLETED,
                              SessionExpired("The session reached this gateway's "
                                             "realtime.max_session_seconds"))
            if idle <= 0:
                return Ending(POLICY, "idle timeout", Outcome.COMPLETED,
                              SessionIdle("No event either way for this gateway's "
                                          "realtime.idle_timeout"))
            done, _ = await asyncio.wait(pumps, timeout=min(idle, left),
                                         return_when=asyncio.FIRST_COMPLETED)
            for pump in done:
                return self._ended(pump)

    def _ended(self, pump: asyncio.Task[Ending]) -> Ending:
        try:
            return pump.result()
        except ClientGone:
            return Ending(NORMAL, "", Outcome.CLIENT_LEFT)
        except ProviderError as exc:
            return Ending(INTERNAL, f"upstream connection lost: {exc.message}"[:120],
                          Outcome.ERROR)

    def _too_big(self, size: int, side: str) -> Ending | None:
        if size <= self.limits.max_frame_bytes:
            return None
        return Ending(TOO_BIG, f"{side} frame over realtime.max_frame_bytes", Outcome.ERROR)

    async def _up(self) -> Ending:
        """The client's frames to the upstream."""
        client, upstream, counts = self.client, self.upstream, self.counts
        while (frame := await client.receive()) is not None:
            size = len(frame)
            if (ending := self._too_big(size, "client")) is not None:
                return ending
            counts.frames_in += 1
            counts.bytes_in += size
            self.last = self.clock()
            await upstream.send(frame)
        return Ending(NORMAL, "", Outcome.COMPLETED)

    async def _down(self) -> Ending:
        """The upstream's frames to the client, each read for its type."""
        client, upstream, counts = self.client, self.upstream, self.counts
        while (frame := await upstream.receive()) is not None:
            size = len(frame)
            if (ending := self._too_big(size, "upstream")) is not None:
                return ending
            counts.frames_out += 1
            counts.bytes_out += size
            self.last = self.clock()
            try:
                event = EVENT.decode(frame)
            except (msgspec.DecodeError, msgspec.ValidationError):
                event = Event()
            if event.type == "error":
                frame = self.redactor.text(frame) if isinstance(frame, str) \
                    else self.redactor.encoded(frame)
            ending = await self.watch(event) if event.type == "response.done" else None
            await client.send(frame)
            if ending is not None:
                return ending
        code = upstream.close_code
        if code in (NORMAL, GOING_AWAY):
            return Ending(NORMAL, "the upstream ended the session", Outcome.COMPLETED)
        return Ending(INTERNAL, "upstream connection lost"
                      + (f" (close code {code})" if code is not None else ""), Outcome.ERROR)
