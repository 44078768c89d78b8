"""The request guard: the limits on a request that the ASGI server leaves to the app.

The server (granian, started by `gateway serve`) closes a connection whose request head does not
arrive within `server.header_timeout`, or that stays idle between requests past it, and bounds
the head it buffers (see `gateway.edge.serving`). What is left is enforced here (`Limits`,
checked by `gateway.edge.front.Front` before any route reads the request):

- a head over `server.max_header_bytes` is answered 431 `headers_too_large` in the JSON
  envelope (the server's own buffer is sized above the limit, so only a head far past it is cut
  by the server itself, with a bare 431);
- a declared body (`Content-Length` or chunked) must arrive whole within `server.body_timeout`
  of the request's head: past it the client gets 408 `request_timeout` in the envelope, if no
  answer has started, with `Connection: close`, and the app's read of the body raises that same
  `RequestTimeout` (so its record and log line say 408, what the client got, and no upstream
  work starts for a body that never came); once an answer has started, the app is told the
  client left (`http.disconnect`).

Only `scope`, `receive` and `send` are touched, so any ASGI server runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from gateway.core.errors import HeadersTooLarge, RequestTimeout
from gateway.core.settings import ServerConfig
from providers.contract.errors import GatewayError, error_body
from providers.wire.expiry import Sweep

_DISCONNECT: ReceiveMessage = {"type": "http.disconnect"}
# ": " and CRLF around each header line as the client sent it.
_LINE_OVERHEAD = 4


def read_head(scope: Scope) -> tuple[int, bool, bytes | None, list[str] | None]:
    """What the edge checks of a request head, read in one pass: its size as the client sent it
    (target and header lines, give or take the method and version), whether it declares a body,
    its `Host` as sent and its `Origin` values (None: none)."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    has_body = False
    host: bytes | None = None
    origins: list[str] | None = None
    for name, value in scope["headers"]:
        size += len(name) + len(value) + _LINE_OVERHEAD
        if name == b"host":
            host = value
        elif name == b"content-length":
            has_body = has_body or value.strip() not in (b"0", b"")
        elif name == b"transfer-encoding":
            has_body = True
        elif name == b"origin":
            if origins is None:
                origins = [value.decode("latin-1")]
            else:
                origins.append(value.decode("latin-1"))
    return size, has_body, host, origins


async def answer(send: Send, error: GatewayError) -> None:
    """A whole error answer in the envelope, closing the connection after it: the rest of what
    this client sends on it is not worth reading."""
    body = error_body(error)
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Limits:
    """The head's size bound and the body's deadline, of llms.json's `server` section."""

    __slots__ = ("body_timeout", "max_header_bytes", "overdue")

    def __init__(self, *, max_header_bytes: int, body_timeout: float) -> None:
        self.max_header_bytes = max_header_bytes
        self.body_timeout = body_timeout
        # The bodies being waited for, checked against their deadlines by one timer: a timer
        # per request would cost more than all the rest of the guard. A body is cut at most
        # a tenth of its time (or a second) late.
        self.overdue: Sweep[BodyDeadline] = Sweep(min(1.0, body_timeout / 10),
                                                  BodyDeadline.expire)

    @classmethod
    def of(cls, server: ServerConfig) -> Limits:
        """The limits of llms.json's `server` section."""
        return cls(max_header_bytes=server.max_header_bytes, body_timeout=server.body_timeout)

    def oversize(self, size: int) -> HeadersTooLarge | None:
        """The refusal of a head of `size` bytes, or None."""
        if size <= self.max_header_bytes:
            return None
        return HeadersTooLarge(f"Request headers are {size} bytes; the gateway accepts up to "
                               f"{self.max_header_bytes}")

    def deadline(self, receive: Receive, send: Send) -> BodyDeadline:
        """A declared body's `receive` and `send`, the body due by `body_timeout`."""
        return BodyDeadline(receive, send, self.body_timeout, self.overdue)


class Guard:
    """An ASGI app wrapping `inner`: head size and body deadline enforced for every HTTP
    request, for a server that serves an app without `gateway.edge.front.Front` (which checks
    the same `Limits` itself)."""

    __slots__ = ("inner", "limits")

    def __init__(self, inner: ASGIApp, *, max_header_bytes: int, body_timeout: float) -> None:
        self.inner = inner
        self.limits = Limits(max_header_bytes=max_header_bytes, body_timeout=body_timeout)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.inner(scope, receive, send)
            return
        size, has_body, _, _ = read_head(scope)
        if (refused := self.limits.oversize(size)) is not None:
            await answer(send, refused)
            return
        if not has_body:
            await self.inner(scope, receive, send)
            return
        deadline = self.limits.deadline(receive, send)
        await self.inner(scope, deadline.receive, deadline.send)


def _overdue_error() -> RequestTimeout:
    return RequestTimeout("The request body did not arrive in time")


class BodyDeadline:
    """One request's `receive` and `send`, with its body due by a deadline.

    Until the body's last chunk, `receive` waits no later than the deadline. Past it: a 408 if
    no answer has started, and `RequestTimeout` raised to the app by that `receive` and every
    later one (the app records what the client got); with an answer begun, `http.disconnect`.
    After a 408, whatever the app still sends (its own error answer) is dropped: the client has
    its answer already."""

    __slots__ = ("_receive", "_send", "answered", "done", "due", "expired", "overdue", "started",
                 "task")

    def __init__(self, receive: Receive, send: Send, timeout: float,
                 overdue: Sweep[BodyDeadline]) -> None:
        self._receive = receive
        self._send = send
        self.overdue = overdue
        self.due = asyncio.get_running_loop().time() + timeout  # the body's deadline
        self.task: asyncio.Task[Any] | None = None  # the one waiting in `receive`
        self.done = False  # the body's last chunk has arrived
        self.expired = False
        self.started = False  # an answer has begun: no 408 can be sent any more
        self.answered = False  # the 408 went out

    def expire(self) -> None:
        """The deadline passed while `receive` waited: wake it."""
        if self.task is not None and not self.expired:
            self.expired = True
            self.task.cancel()

    def receive(self) -> Awaitable[ReceiveMessage]:
        """The next message, to await; `http.disconnect` once the body is overdue. With the
        body in, the server's own `receive`: nothing of this guard's left to resume."""
        if self.done:
            return self._receive()
        return self._within()

    async def _within(self) -> ReceiveMessage:
        if self.expired:
            return self._overdue()
        self.task = task = asyncio.current_task()
        self.overdue.add(self)
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            # Ours (the deadline) unless someone else cancelled this task too.
            if not self.expired or (task is not None and task.uncancel() > 0):
                raise
            return await self._timed_out()
        finally:
            self.overdue.discard(self)
            self.task = None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.done = True
        return message

    async def _timed_out(self) -> ReceiveMessage:
        if not self.started:
            self.started = self.answered = True
            await answer(self._send, _overdue_error())
        return self._overdue()

    def _overdue(self) -> ReceiveMessage:
        if self.answered:
            raise _overdue_error()
        return _DISCONNECT

    def send(self, message: Message) -> Awaitable[None]:
        """Pass the app's message on (the server's own `send`, to await), unless the 408 went
        out in its place."""
        if self.answered:
            return _dropped()
        if message["type"] == "http.response.start":
            self.started = True
        return self._send(message)


async def _dropped() -> None:
    """What sending a message the client will never read comes to."""
