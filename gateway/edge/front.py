"""The one ASGI adapter: the edge's checks, the relay routes served as plain ASGI, everything else
by Litestar.

Every HTTP request's head is read once for the checks no route may skip: its origin and `Host`
(`gateway.edge.origins`), its size and its body's deadline (`gateway.edge.guard`); a WebSocket
handshake's origin and `Host` too. They are calls here, not ASGI layers around `Front`: a layer
apiece cost every request an awaited frame and its own pass over the headers.

`POST /v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/embeddings`, `/v1/messages`,
`/v1/messages/count_tokens` and the native endpoints (moderations, rerank, images, audio:
`gateway.adapters.native`) are the data plane: the relay (`gateway.pipeline.relay`) needs none
of Litestar's per-request work (routing, its Request object, response conversion), so `Front` reads
the request from the scope into a framework-free `Call`, runs it through its endpoint's stages
(`relay.handle`), and turns the delivery into ASGI messages here, and only here. Once the answer
is sent, however it ended, the call is closed, and its stages give back what they held (the
queue's slot). `/passthrough/...` is served as plain ASGI too (`passthrough`). Only `scope`,
`receive` and `send` are touched, so any ASGI server runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from litestar import Litestar
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from gateway.adapters import native
from gateway.core import endpoints
from gateway.core.call import Call, ClientDisconnected, Meter, unmetered
from gateway.core.delivery import STREAM_HEADERS, Streamed, Whole
from gateway.core.errors import MethodNotAllowed, RequestTooLarge, ShuttingDown
from gateway.core.record import HEADERS, Record, request_id
from gateway.edge import passthrough
from gateway.edge.disconnect import Arming, DisconnectGuard, new_arming
from gateway.edge.guard import Limits, answer, read_head
from gateway.edge.origins import Origins
from gateway.pipeline import relay
from gateway.state.drain import Drain
from gateway.state.runtime import Runtime
from providers.contract.errors import (
    Dialect,
    GatewayError,
    InvalidRequest,
    error_body,
    error_event,
)
from providers.contract.stream import close_quietly

# With and without the /v1 prefix, as vLLM and LiteLLM answer them.
# Cohere's v2 client reranks at /v2/rerank (vLLM answers it there too, in the same shape).
RELAY_PATHS = {**{f"/v1/{e}": e for e in endpoints.RELAYED},
               **{f"/{e}": e for e in endpoints.RELAYED}, "/v2/rerank": "rerank"}
# Read for every request: on Python 3.11 a member read off its enum class goes through
# `EnumType.__getattr__`'s attribute hook, a call of its own each time.
_HTTP = ScopeType.HTTP
# The names of the headers every answer carries, as ASGI sends them: encoded once, not per
# answer (any other name is encoded as it comes).
_NAMES = {name: name.lower().encode("latin-1") for name in (*HEADERS, *STREAM_HEADERS)}


class RawRequest:
    """What the edge reads of a request from the ASGI scope: its headers, its body."""

    __slots__ = ("_arming", "_max_body", "headers", "read_whole", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive, max_body: int,
                 arming: Arming | None = None) -> None:
        self.scope = scope
        self.receive = receive
        self._max_body = max_body
        self._arming = arming
        self.read_whole = False  # the body's last chunk was read
        # ASGI servers send header names lowercased; a repeated header keeps its last value.
        self.headers: Mapping[str, str] = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}

    def watching(self) -> DisconnectGuard:
        """The watch of the client's connection (`Call.watching`): a client that leaves
        ends what runs inside it."""
        return DisconnectGuard(self.receive, self._arming)

    async def body(self, meter: Meter = unmetered) -> bytes:
        """The whole body; RequestTooLarge past the limit (announced or streamed). `meter` is
        told the declared length before anything is read, else each chunk before it is kept."""
        declared = self.headers.get("content-length")
        length = int(declared) if declared is not None and declared.isascii() \
            and declared.isdigit() else None
        if length is not None:
            if length > self._max_body:
                raise RequestTooLarge("Request body is larger than the gateway accepts")
            meter(length)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                # granian tells a body it could not read (a chunk's size, CRLF or extension
                # malformed, a connection cut mid-body) as a disconnect, and still takes the
                # answer: a client still there gets a 400, as nginx answers a body cut short.
                raise InvalidRequest("Request body is malformed or ended before it was "
                                     "complete (its chunked framing or its length)")
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            size += len(chunk)
            if size > self._max_body:
                raise RequestTooLarge("Request body is larger than the gateway accepts")
            if length is None:
                meter(len(chunk))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        self.read_whole = True
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def discard(self) -> None:
        """Read what is left of a body refused before it was read, and drop it (no more than
        the body limit, within the body's deadline): a client still sending it then reads the
        answer, where a connection closed on bytes unread is reset, often before the client
        has read it."""
        left = self._max_body
        with contextlib.suppress(GatewayError, OSError):
            while not self.read_whole and left > 0:
                message = await self.receive()
                if message["type"] != "http.request":
                    return
                left -= len(message.get("body", b""))
                self.read_whole = not message.get("more_body", False)


class Front:
    """The ASGI app: every request's origin, `Host` and head checked, a declared body given its
    deadline (one read of the head, no layer apiece); then the relay routes served here,
    everything else by `others` (Litestar, or what routes its own paths in front of it), whose
    state holds the runtime."""

    def __init__(self, app: Litestar, others: ASGIApp | None = None, *,
                 origins: Origins, limits: Limits) -> None:
        self.app = app
        self.others: ASGIApp = others if others is not None else app
        self.origins = origins
        self.limits = limits
        self.arming = new_arming()  # the disconnect guards of its requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != _HTTP:
            if scope["type"] == ScopeType.WEBSOCKET and not self._welcome(scope):
                # A page may open a WebSocket to any address: the same check, and a handshake
                # closed before it is accepted is a 403 for the page.
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": 1008, "reason": ""})
                return
            await self.others(scope, receive, send)
            return
        size, has_body, host, origins = read_head(scope)
        refused: GatewayError | None = self.origins.refusal(host, origins)
        if refused is None and size > self.limits.max_header_bytes:  # else no call to make
            refused = self.limits.oversize(size)
        if refused is not None:
            await answer(send, refused)
            return
        if has_body:
            deadline = self.limits.deadline(receive, send)
            receive, send = deadline.receive, deadline.send
        endpoint = RELAY_PATHS.get(scope["path"])
        if endpoint is None:
            if scope["path"].startswith(passthrough.PREFIX):
                await self._pass(scope, receive, send)
                return
            await self.others(scope, receive, send)
            return
        # An item: State finds an attribute only after an AttributeError was raised for it.
        runtime: Runtime = self.app.state["runtime"]
        if runtime.trace is not None:
            runtime.trace("request")
        limit = native.upload_limit(endpoint, runtime.live.snapshot.server.max_body_bytes)
        request = RawRequest(scope, receive, limit, self.arming)
        if (method := scope.get("method")) != "POST":
            error = MethodNotAllowed(f"Method {method} not allowed for {scope['path']}")
            headers = {"allow": "POST", "x-request-id": request_id(request.headers)}
            await _send_body(error_body(error), error.status, "application/json", headers,
                             send)
            return
        call = Call(endpoint, request.headers,
                    Record(request_id(request.headers), endpoint, runtime.listeners),
                    request.body, request.watching)
        try:
            with runtime.serving(request.headers, endpoint):  # its span, when traced
                await self._answer(call, request, runtime, send)
        finally:
            call.close()
        if not request.read_whole:  # refused before its body was read (full, too large)
            await request.discard()

    def _welcome(self, scope: Scope) -> bool:
        _, _, host, origins = read_head(scope)
        return self.origins.refusal(host, origins) is None

    async def _pass(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime: Runtime = self.app.state["runtime"]
        # No slot under the concurrency cap: it is not a model's request.
        request = RawRequest(scope, receive, runtime.live.snapshot.server.max_body_bytes,
                             self.arming)
        answer = await passthrough.handle(request, runtime)
        try:
            await send_whole(answer, send)
        finally:
            answer.record.end(answer.outcome)

    async def _answer(self, call: Call, request: RawRequest, runtime: Runtime, send: Send
                      ) -> None:
        try:
            answer = await relay.handle(call, runtime)
        except Exception:  # a bug past the relay's own net: logged, answered and counted
            answer = relay.bug(request.headers, call.endpoint, runtime)
        if answer is None:  # the client left: nothing to write
            return
        if isinstance(answer, Streamed):
            await send_stream(answer, request.receive, send, self.arming, runtime.drain)
            return
        try:
            await send_whole(answer, send)
            if runtime.trace is not None:
                runtime.trace("answered")
        finally:  # the request's end is not the client's to wait for: after its answer
            answer.record.end(answer.outcome)


def _head(status: int, media_type: str, headers: Mapping[str, str],
          framing: tuple[bytes, bytes] | None) -> Message:
    encoded = [(b"content-type", media_type.encode("latin-1"))]
    if framing is not None:
        encoded.append(framing)
    names = _NAMES
    encoded += [(names[name] if name in names else name.lower().encode("latin-1"),
                 value.encode("latin-1")) for name, value in headers.items()]
    return {"type": "http.response.start", "status": status, "headers": encoded}


async def send_whole(answer: Whole, send: Send) -> None:
    """A complete answer, its bytes as they are, nothing re-encoded."""
    await _send_body(answer.body, answer.status, answer.media_type, answer.headers, send)


async def _send_body(body: bytes, status: int, media_type: str, headers: Mapping[str, str],
                     send: Send) -> None:
    length = (b"content-length", b"%d" % len(body))
    await send(_head(status, media_type, headers, length))
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_stream(answer: Streamed, receive: Receive, send: Send, arming: Arming,
                      drain: Drain | None = None) -> None:
    """Relay a stream's chunks as they come, one ASGI message each.

    The stream has already produced its first chunk (`relay` peeks before it commits), so its
    generator is started and its own `finally` (the log line, metrics, closing the upstream)
    runs once it is closed here, whether it ended, failed or the client left. A client that
    leaves is seen at the next write, or while the upstream is quiet by the disconnect guard,
    which cancels the wait. A shutdown whose drain time runs out (`drain`) ends the stream with
    the in-band error, never a silent cut.
    """
    chunks = answer.chunks
    head: Message | None = _head(answer.status, answer.media_type, answer.headers, None)
    try:
        tracked = drain.tracking(answer.record) if drain is not None else None
        with tracked or contextlib.nullcontext():
            async with DisconnectGuard(receive, arming):
                async for chunk in chunks:  # the first chunk is at hand: the stream has begun
                    if head is not None:
                        await send(head)
                        head = None
                    if chunk:
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
    except (ClientDisconnected, OSError):
        pass  # the client is gone: the stream's own ending records it
    except asyncio.CancelledError:
        if drain is None or not drain.was_cut():
            raise
        await _cut_short(head, send, answer.record.dialect)
    finally:
        await close_quietly(chunks)


async def _cut_short(head: Message | None, send: Send, dialect: Dialect) -> None:
    error = ShuttingDown("The gateway is shutting down and its drain time ran out; the "
                         "answer is incomplete: retry it")
    with contextlib.suppress(OSError):
        if head is not None:
            await send(head)
        await send({"type": "http.response.body", "body": error_event(error, dialect),
                    "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
