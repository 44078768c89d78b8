"""The transport's WebSockets (`Transport.websocket`): aiohttp's `ws_connect` on the process's one
session, its errors translated as a request's are.

    handshake not done within connect_timeout     ConnectTimeout
    upgrade refused with 429                      ProviderRateLimited (its Retry-After kept)
    upgrade refused with 401 / 403 / 404          ProviderRejected (this provider's config)
    upgrade refused otherwise (5xx, 4xx)          ProviderUnavailable, its status kept
    an upgrade that is no WebSocket's             BadUpstreamResponse
    a frame larger than max_frame_bytes           BadUpstreamResponse (the socket is closed)

Frames come and go as they are (text, binary); nothing is parsed here. A send returns once
aiohttp's writer took the frame, waiting for the socket to drain when its buffer is full, and
aiohttp stops reading the socket while its own queue of received frames is full: neither side
grows without bound however slow the other is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping

import aiohttp
from aiohttp import WSMsgType
from yarl import URL

from providers.contract.errors import (
    BadUpstreamResponse,
    ConnectTimeout,
    GatewayError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderUnavailable,
)
from providers.wire.upstream_errors import retry_after

# Seconds a closing handshake may take before the connection is dropped.
CLOSE_TIMEOUT = 5.0
_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)


def refused(status: int, headers: Mapping[str, str]) -> GatewayError:
    """What an upgrade refused with `status` means for failover."""
    if status == 429:
        return ProviderRateLimited("the upstream refused the WebSocket: 429",
                                   retry_after=retry_after(headers))
    if status in (401, 403, 404):
        return ProviderRejected(f"the upstream refused the WebSocket: {status}",
                                upstream_status=status)
    if status == 101:
        return BadUpstreamResponse("the upstream's upgrade answer is not a WebSocket's")
    return ProviderUnavailable(f"the upstream refused the WebSocket: {status}",
                               upstream_status=status)


class AiohttpSocket:
    """An open aiohttp WebSocket as the contract's `UpstreamSocket`."""

    __slots__ = ("_errors", "_ws")

    def __init__(self, ws: aiohttp.ClientWebSocketResponse,
                 errors: contextlib.AbstractContextManager[None]) -> None:
        self._ws = ws
        self._errors = errors

    @property
    def close_code(self) -> int | None:
        return self._ws.close_code

    async def receive(self) -> str | bytes | None:
        with self._errors:
            message = await self._ws.receive()
        if message.type in _DATA:
            data: str | bytes = message.data
            return data
        if message.type is WSMsgType.ERROR:
            if self._ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG:
                raise BadUpstreamResponse("the upstream sent a frame larger than the "
                                          "gateway's frame limit")
            raise ProviderUnavailable("connection lost: the upstream WebSocket broke")
        return None  # closed, or closing

    async def send(self, frame: str | bytes) -> None:
        with self._errors:
            if isinstance(frame, str):
                await self._ws.send_str(frame)
            else:
                await self._ws.send_bytes(frame)

    async def close(self, code: int = 1000) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close(code=code)


async def open_socket(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], *,
                      proxy: URL | None, ssl_context: ssl.SSLContext | bool,
                      errors: contextlib.AbstractContextManager[None], connect_timeout: float,
                      max_frame_bytes: int) -> AiohttpSocket:
    """The WebSocket at `url`, its handshake done within `connect_timeout`."""
    try:
        async with asyncio.timeout(connect_timeout):
            with errors:
                try:
                    ws = await session.ws_connect(
                        url, headers=headers, proxy=proxy, ssl=ssl_context,
                        max_msg_size=max_frame_bytes, autoclose=True, autoping=True,
                        timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT))
                except aiohttp.WSServerHandshakeError as exc:  # before `errors` renames it
                    raise refused(exc.status, exc.headers or {}) from None
    except TimeoutError:
        raise ConnectTimeout(f"no WebSocket handshake within {connect_timeout:g} s") from None
    return AiohttpSocket(ws, errors)
