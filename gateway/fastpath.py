"""The relay routes served straight from ASGI, in front of Litestar.

`POST /v1/chat/completions`, `/v1/completions` and `/v1/responses` are the data plane: under load,
Litestar's own work per request (routing, its Request object, response conversion, exception
middleware) was about a fifth of the gateway's CPU (docs/benchmarks.md), and the relay uses none
of it. `FastRelay` reads the headers and body from the scope, runs `relay.handle`, and sends the
answer itself: under uvicorn straight to its transport (`write_to_uvicorn`, `stream_to_uvicorn`),
under another ASGI server as ASGI messages (a stream through Litestar's streaming response).
Everything else (other routes and methods, 404/405, lifespan) goes to Litestar unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from litestar import Litestar, Request
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from gateway import relay
from gateway.disconnect import ClientDisconnected, DisconnectGuard
from gateway.services import Services
from gateway.streaming import close_quietly
from providers.contract.errors import GatewayError, RequestTooLarge, envelope
from providers.contract.log import get_logger

RELAY_PATHS = {"/v1/chat/completions": "chat/completions", "/v1/completions": "completions",
               "/v1/responses": "responses"}


class RawRequest:
    """What the relay reads of a request, from the ASGI scope: headers, body, the channel."""

    __slots__ = ("_max_body", "headers", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive, max_body: int) -> None:
        self.scope = scope
        self.receive = receive
        self._max_body = max_body
        # ASGI servers send header names lowercased; a repeated header keeps its last value.
        self.headers: Mapping[str, str] = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}

    async def body(self) -> bytes:
        """The whole body; RequestTooLarge past the limit (announced or streamed)."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise RequestTooLarge("Request body is larger than the gateway accepts")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                break
            chunk: bytes = message.get("body", b"")  # type: ignore[assignment]
            size += len(chunk)
            if size > self._max_body:
                raise RequestTooLarge("Request body is larger than the gateway accepts")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class FastRelay:
    """An ASGI app: the relay routes itself, everything else through Litestar."""

    def __init__(self, app: Litestar) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = RELAY_PATHS.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        services: Services = self.app.state.services
        request = RawRequest(scope, receive, services.live.snapshot.server.max_body_bytes)
        try:
            response = await relay.handle(request, endpoint, services)
        except Exception:  # a bug: logged with its traceback, answered in the envelope
            get_logger().exception("unhandled_error", path=scope["path"])
            response = relay.Answer(envelope(GatewayError("Internal gateway error")),
                                    {"x-request-id": relay.request_id(request.headers)},
                                    status=500)
        if isinstance(response, relay.StreamAnswer):
            if await stream_to_uvicorn(response, receive, send):
                return
            scope["app"] = self.app  # Litestar's response machinery looks the app up here
            asgi = response.to_response().to_asgi_response(self.app, Request(scope, receive))
            await asgi(scope, receive, send)
            return
        try:
            await send_whole(response, send)
        finally:
            if response.after is not None:
                response.after()


async def send_whole(answer: relay.Answer, send: Send) -> None:
    """A complete answer, its bytes as they are, nothing re-encoded: in one write to uvicorn's
    transport when it is there, else as two ASGI messages."""
    body = answer.body
    headers = [(b"content-type", answer.media_type.encode("latin-1")),
               (b"content-length", b"%d" % len(body)), *_encoded(answer.headers)]
    if write_to_uvicorn(send, answer.status, headers, body):
        return
    start: HTTPResponseStartEvent = {"type": "http.response.start", "status": answer.status,
                                     "headers": headers}
    await send(start)
    whole: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body,
                                    "more_body": False}
    await send(whole)


def _encoded(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in headers.items()]


def _uvicorn_cycle(send: Send) -> RequestResponseCycle | None:
    """uvicorn's httptools cycle behind `send`, if that is what it is and it can take a write."""
    cycle = getattr(send, "__self__", None)
    if (type(cycle) is not RequestResponseCycle or cycle.response_started or cycle.disconnected
            or cycle.flow.write_paused):
        return None
    return cycle


def _head(cycle: RequestResponseCycle, status: int, headers: list[tuple[bytes, bytes]]
          ) -> list[bytes]:
    head = [STATUS_LINE[status]]
    head += [b"%s: %s\r\n" % pair for pair in cycle.default_headers]
    head += [b"%s: %s\r\n" % pair for pair in headers]
    if not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    return head


def _complete(cycle: RequestResponseCycle) -> None:
    cycle.response_complete = True
    cycle.message_event.set()  # a receive() still waiting learns the exchange is over
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


async def stream_to_uvicorn(response: relay.StreamAnswer, receive: Receive, send: Send) -> bool:
    """Relay a stream's chunks straight to uvicorn's transport, each in one write (the head
    with the first); False (nothing sent) when `send` is not uvicorn's httptools cycle.

    In place of Litestar's streaming response, which sends every chunk as an ASGI message
    through uvicorn's checks and keeps a task group per stream. A client that leaves is seen
    at the next write, or while the upstream is quiet by the disconnect guard, which cancels
    the wait; either way the relay's iterator is closed (the upstream with it) and the
    answer's `after` runs.
    """
    cycle = _uvicorn_cycle(send)
    if cycle is None:
        return False
    headers = [(b"content-type", response.media_type.encode("latin-1")),
               (b"transfer-encoding", b"chunked"), *_encoded(response.headers)]
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    pending = _head(cycle, response.status, headers)
    chunks = response.chunks
    try:
        async with DisconnectGuard(receive):
            async for chunk in chunks:
                if cycle.disconnected:
                    break
                if cycle.flow.write_paused:
                    await cycle.flow.drain()
                if chunk:
                    pending += (b"%x\r\n" % len(chunk), chunk, b"\r\n")
                    cycle.transport.write(b"".join(pending))
                    pending = []
            else:
                pending.append(b"0\r\n\r\n")
                cycle.transport.write(b"".join(pending))
                _complete(cycle)
    except ClientDisconnected:
        pass
    finally:
        await close_quietly(chunks)
        await response.after()
    return True


def write_to_uvicorn(send: Send, status: int, headers: list[tuple[bytes, bytes]],
                     body: bytes) -> bool:
    """Write a whole answer straight to the connection of uvicorn's httptools cycle; False
    (nothing written) when `send` is not one, or the connection cannot take it now.

    uvicorn writes the head on `http.response.start` and the body on `http.response.body`: two
    send syscalls, and a check of every header by regex, per answer. One write instead was worth
    ~5% of req/s (docs/benchmarks.md). This does what `RequestResponseCycle.send` does for a
    response with a Content-Length, to the same attributes; uvicorn's minor version is pinned in
    pyproject.toml and a test asserts this path is taken, so an upgrade cannot silently lose it.
    Header values are the gateway's own or checked (`relay.request_id`), never raw CR/LF.
    """
    cycle = _uvicorn_cycle(send)
    if cycle is None:
        return False
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.transport.write(b"".join([*_head(cycle, status, headers), body]))
    _complete(cycle)
    return True
