"""`/v1/realtime`: the WebSocket accepted by Litestar and handed over to `gateway.realtime`.

The edge reads the handshake (headers, `?model=`, the subprotocols offered) and wraps the
socket in what the session needs (`relay.ClientSocket`: frames in and out, accept, close);
everything else, the key, the limits, the upstream, the relay and the record, is the
session's (`gateway.realtime.session.serve`). Only Litestar's public WebSocket API is used:
its ASGI `receive` and `send`, `accept` and `close`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect
from litestar.types.asgi_types import WebSocketSendEvent

from gateway.realtime import session
from gateway.realtime.relay import ClientGone

PATHS = ["/v1/realtime", "/realtime"]


class LitestarClient:
    """A Litestar WebSocket as the session's `ClientSocket`."""

    __slots__ = ("socket",)

    def __init__(self, socket: WebSocket[Any, Any, Any]) -> None:
        self.socket = socket

    async def accept(self, subprotocol: str | None, headers: dict[str, str]) -> None:
        try:
            await self.socket.accept(subprotocols=subprotocol, headers=headers)
        except Exception:
            raise ClientGone from None

    async def receive(self) -> str | bytes | None:
        try:
            message = await self.socket.receive()
        except WebSocketDisconnect:
            return None
        if message["type"] != "websocket.receive":
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    async def send(self, frame: str | bytes) -> None:
        try:
            event: WebSocketSendEvent = {"type": "websocket.send", "text": frame, "bytes": None} \
                if isinstance(frame, str) else \
                {"type": "websocket.send", "bytes": frame, "text": None}
            await self.socket.send(event)
        except Exception:
            raise ClientGone from None

    async def close(self, code: int, reason: str) -> None:
        with contextlib.suppress(WebSocketDisconnect, OSError):
            await self.socket.close(code, reason)


@websocket(PATHS)
async def realtime(socket: WebSocket[Any, Any, Any]) -> None:
    """A Realtime session (`gateway.realtime.session`)."""
    state = socket.app.state
    # One entry may hold the whole comma-separated header (granian's, unlike other servers).
    offered = tuple(name.strip() for entry in socket.scope.get("subprotocols") or ()
                    for name in entry.split(",") if name.strip())
    opening = session.Opening(
        {name.lower(): value for name, value in socket.headers.items()},
        socket.query_params.get("model"), offered)
    await session.serve(LitestarClient(socket), opening, state.runtime, state.realtime)
