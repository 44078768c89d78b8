"""The relay routes served straight from ASGI, in front of Litestar.

`POST /v1/chat/completions`, `/v1/completions` and `/v1/responses` are the data plane: under load,
Litestar's own work per request (routing, its Request object, response conversion, exception
middleware) was about a fifth of the gateway's CPU (docs/benchmarks.md), and the relay uses none
of it. `FastRelay` reads the headers and body from the scope, runs `relay.handle`, and sends a
whole answer itself; a stream is handed to Litestar's streaming response, whose disconnect
handling the relay relies on. Everything else (other routes and methods, 404/405, lifespan) goes
to Litestar unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from litestar import Litestar, Request
from litestar.response import Response, Stream
from litestar.types import HTTPResponseBodyEvent, HTTPResponseStartEvent, Receive, Scope, Send

from gateway import relay
from gateway.errors import GatewayError, RequestTooLarge, envelope
from gateway.logs import get_logger
from gateway.runtime import Gateway

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
        gateway: Gateway = self.app.state.gateway
        request = RawRequest(scope, receive, gateway.runtime.snapshot.server.max_body_bytes)
        try:
            response = await relay.handle(request, endpoint, gateway)
        except Exception:  # a bug: logged with its traceback, answered in the envelope
            get_logger().exception("unhandled_error", path=scope["path"])
            response = Response(envelope(GatewayError("Internal gateway error")), status_code=500,
                                media_type="application/json",
                                headers={"x-request-id": relay.request_id(request.headers)})
        if isinstance(response, Stream):
            scope["app"] = self.app  # Litestar's response machinery looks the app up here
            asgi = response.to_asgi_response(self.app, Request(scope, receive))
            await asgi(scope, receive, send)
            return
        await send_whole(response, send)


async def send_whole(response: Response[Any], send: Send) -> None:
    """A complete answer, its bytes as they are: two ASGI messages, nothing re-encoded."""
    body = response.content if isinstance(response.content, bytes) else b""
    media = response.media_type
    media = media.value if isinstance(media, Enum) else str(media)
    headers = [(b"content-type", media.encode("latin-1")),
               (b"content-length", str(len(body)).encode("latin-1"))]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1"))
                for name, value in response.headers.items()]
    start: HTTPResponseStartEvent = {"type": "http.response.start",
                                     "status": response.status_code or 200, "headers": headers}
    await send(start)
    whole: HTTPResponseBodyEvent = {"type": "http.response.body", "body": body,
                                    "more_body": False}
    await send(whole)
