"""A `tools/call` posted straight to a streamable-HTTP MCP server through the gateway's own
transport (the aiohttp session every provider uses), its JSON or SSE answer read here.

The link's SDK client still makes the connection (`initialize` or `server/discover`), lists the
tools and watches the server; a call only needs what that agreed: the protocol revision, the
session id of a 2025-11-25 server, and the tools' `x-mcp-header` maps of a 2026-07-28 one. Going
through the SDK's client for each call cost a task hand-off per message, its memory streams, an
httpx2 request and pydantic validation (docs/benchmarks.md, the MCP section). The request is
what the SDK's client sends: the same headers and `_meta` envelope.

Cancelling a call closes its answer's connection, which a 2026-07-28 server takes as the
cancellation; a 2025-11-25 server is also sent `notifications/cancelled` at once. A 401 trades
the gateway's OAuth token again and posts once more.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable, Mapping
from importlib import metadata
from typing import Any

import msgspec
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    encode_header_value,
    mcp_param_headers,
)
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    INTERNAL_ERROR,
    PROTOCOL_VERSION_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.core.settings.mcp import McpServer
from gateway.mcp.oauth import ClientCredentials
from providers.contract.transport import HttpResponse, Link, ProxyEnvironment, Transport
from providers.wire import sse

SESSION = "mcp-session-id"
ACCEPT = "application/json, text/event-stream"
# Headers a call sets itself: a configured one of the same name gives way, as in the SDK.
OWN_HEADERS = frozenset({"content-type", "accept", SESSION, MCP_PROTOCOL_VERSION_HEADER,
                         MCP_METHOD_HEADER, MCP_NAME_HEADER})
CANCEL_WITHIN = 5.0  # seconds a 2025-11-25 server's `notifications/cancelled` may take
CONNECT_TIMEOUT = 30.0
# Room in an answer beyond the result itself: its envelope, and a structured copy of the text.
ENVELOPE_ROOM = 64 * 1024
Progress = Callable[[float, float | None, str | None], Awaitable[None]]


class Lost(Exception):
    """The server cannot answer on this connection (session gone, stream cut, bad answer): the
    link connects again."""


class _Error(msgspec.Struct):
    code: int
    message: str
    data: Any = None


class _Message(msgspec.Struct):
    """A JSON-RPC message from the server, as far as a call reads it."""

    id: str | int | None = None
    method: str | None = None
    params: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: _Error | None = None


class _ToolResult(msgspec.Struct):
    """What a `CallToolResult` must hold to be passed on (the rest passes untouched)."""

    content: list[dict[str, Any]]
    isError: bool = False
    structuredContent: dict[str, Any] | None = None


class _Progress(msgspec.Struct):
    progressToken: str | int
    progress: float
    total: float | None = None
    message: str | None = None


def _client_info() -> dict[str, str]:
    try:
        version = metadata.version("llms-gateway")
    except metadata.PackageNotFoundError:
        version = "0"
    return {"name": "llms-gateway", "version": version}


class ToolPoster:
    """One streamable-HTTP server's tool calls, posted directly once its link has connected
    (`agreed`); `ready` says whether it has."""

    def __init__(self, server: McpServer, transport: Transport, proxy: str | None) -> None:
        assert server.url is not None
        self.server = server
        self.url = server.url
        self.transport = transport
        self.most = server.max_result_bytes * 2 + ENVELOPE_ROOM
        self.link = Link(proxy=proxy, max_answer_bytes=self.most)
        own = OWN_HEADERS | ({"authorization"} if server.oauth is not None else set())
        self.headers = {name: value.reveal() for name, value in server.headers
                        if name.lower() not in own}
        self.auth: ClientCredentials | None = None
        self.version: str | None = None  # None: not connected, calls go through the SDK
        self.session_id: str | None = None
        self.header_maps: Mapping[str, dict[tuple[str, ...], str]] = {}
        self._ids = itertools.count(1)
        self._envelope: dict[str, Any] = {}
        self._head: dict[str, str] = {}
        self._cancelling: set[asyncio.Task[None]] = set()

    @classmethod
    def of(cls, server: McpServer, transport: Transport | None) -> ToolPoster | None:
        """The poster of a remote server; None for a spawned one, without a transport, or when
        the environment names a proxy the transport cannot speak (the SDK's client then calls,
        as it connects)."""
        if server.url is None or transport is None:
            return None
        try:
            proxy = ProxyEnvironment.read(os.environ).proxy_for(server.url)
        except ValueError:
            return None
        return cls(server, transport, proxy)

    def bounded(self, max_result_bytes: int) -> None:
        """The server's bound as the live config gives it (a reload may change it)."""
        most = max_result_bytes * 2 + ENVELOPE_ROOM
        if most != self.most:
            self.most = most
            self.link = Link(proxy=self.link.proxy, max_answer_bytes=most)

    @property
    def ready(self) -> bool:
        return self.version is not None

    def agreed(self, version: str | None, session_id: str | None,
               auth: ClientCredentials | None) -> None:
        """What the link's connection agreed (None: it is gone, calls wait for the next)."""
        self.version, self.session_id, self.auth = version, session_id, auth
        self._envelope = {PROTOCOL_VERSION_META_KEY: version, CLIENT_INFO_META_KEY:
                          _client_info(), CLIENT_CAPABILITIES_META_KEY: {}}
        # Every call's headers but the tool's, built once per connection. No compression is
        # asked for here rather than by `compressed=False` (which looks and copies per call):
        # the same wire, a configured `Accept-Encoding` winning as there.
        head = {**self.headers, "content-type": "application/json", "accept": ACCEPT}
        if not any(name.lower() == "accept-encoding" for name in head):
            head["accept-encoding"] = "identity"
        if version is not None:
            head[MCP_PROTOCOL_VERSION_HEADER] = version
        if session_id:
            head[SESSION] = session_id
        if version in MODERN_PROTOCOL_VERSIONS:
            head[MCP_METHOD_HEADER] = "tools/call"
        self._head = head

    async def call(self, tool: str, arguments: dict[str, Any] | None,
                   progress: Progress | None) -> tuple[dict[str, Any], int]:
        """The `CallToolResult` as JSON and the size of the message it came in; MCPError for
        the server's JSON-RPC error, Lost when this connection cannot answer, a transport
        error (`GatewayError`) as it is raised."""
        version = self.version
        assert version is not None
        request_id = f"llms-gateway-{next(self._ids)}"
        params: dict[str, Any] = {"name": tool}
        if arguments is not None:
            params["arguments"] = arguments
        meta: dict[str, Any] = {"progressToken": request_id} if progress is not None else {}
        headers = {**self._head, MCP_NAME_HEADER: encode_header_value(tool)}
        session_id = self.session_id
        if version in MODERN_PROTOCOL_VERSIONS:
            meta.update(self._envelope)
            if (mapped := self.header_maps.get(tool)) and arguments:
                headers.update(mcp_param_headers(mapped, arguments))
        if meta:
            params["_meta"] = meta
        body = msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                                    "params": params})
        answered = False
        try:
            answer = await self._post(body, headers)
            try:
                result = await self._answer(answer, request_id, progress)
            finally:
                answer.close()  # unread: its connection closes, a 2026-07-28 cancellation
            answered = True
            return result
        except MCPError:
            answered = True  # the server's own error: it is done with the call
            raise
        finally:
            if not answered and session_id and version not in MODERN_PROTOCOL_VERSIONS:
                self._cancel(request_id, headers)

    async def _post(self, body: bytes, headers: dict[str, str]) -> HttpResponse:
        auth = self.auth
        token = await auth.token() if auth is not None else None
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        answer = await self.transport.request("POST", self.url, headers=headers, body=body,
                                              link=self.link, connect_timeout=CONNECT_TIMEOUT)
        if answer.status == 401 and auth is not None:  # revoked or expired early: once more
            answer.close()
            headers["authorization"] = f"Bearer {await auth.token(stale=token)}"
            answer = await self.transport.request(
                "POST", self.url, headers=headers, body=body, link=self.link,
                connect_timeout=CONNECT_TIMEOUT)
        return answer

    async def _answer(self, answer: HttpResponse, request_id: str, progress: Progress | None
                      ) -> tuple[dict[str, Any], int]:
        status = answer.status
        kind = answer.headers.get("content-type", "").partition(";")[0].strip().lower()
        if status >= 400 or status == 202:
            await self._refused(answer, status, kind)
        if kind == "application/json":
            data = await answer.read()
            return self._result(self._decoded(data), request_id), len(data)
        if kind != "text/event-stream":
            raise Lost(f"the server answered tools/call as {kind[:64] or 'nothing'}")
        return await self._streamed(answer, request_id, progress)

    async def _refused(self, answer: HttpResponse, status: int, kind: str) -> None:
        """An answer that is no result: the JSON-RPC error it carries, or one saying so."""
        if status == 404 and self.session_id:
            raise Lost("the server ended the session")
        if kind == "application/json":  # a JSON-RPC error may come with an HTTP status
            found = self._decoded(await answer.read())
            if found.error is not None:
                raise MCPError(found.error.code, found.error.message, found.error.data)
        raise MCPError(INTERNAL_ERROR, f"the server answered tools/call with HTTP {status}")

    async def _streamed(self, answer: HttpResponse, request_id: str, progress: Progress | None
                        ) -> tuple[dict[str, Any], int]:
        """The answer event of an SSE answer, the call's progress relayed until it comes."""
        reader = sse.Reader(max_line=self.most)
        while chunk := await answer.readany():
            for event in reader.feed(chunk):
                if event.data and (found := await self._heard(event.data, request_id, progress)):
                    return self._result(found, request_id), len(event.data)
            if reader.garbage:
                raise Lost(f"the server's answer is not SSE or over {self.most} bytes an event")
        for event in reader.flush():
            if event.data and (found := await self._heard(event.data, request_id, progress)):
                return self._result(found, request_id), len(event.data)
        raise Lost("the server's stream ended without an answer")

    async def _heard(self, data: bytes, request_id: str, progress: Progress | None
                     ) -> _Message | None:
        """The call's answer, if `data` is it; its progress relayed, other messages let be (the
        link's SDK client hears the server's notifications on its own stream)."""
        message = self._decoded(data)
        if message.id == request_id and message.method is None:
            return message
        if message.method == "notifications/progress" and progress is not None \
                and message.params is not None:
            try:
                told = msgspec.convert(message.params, _Progress)
            except msgspec.ValidationError:
                return None
            if told.progressToken == request_id:
                await progress(told.progress, told.total, told.message)
        return None

    @staticmethod
    def _decoded(data: bytes) -> _Message:
        try:
            return msgspec.json.decode(data, type=_Message)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise Lost("the server's answer is not a JSON-RPC message") from None

    def _result(self, message: _Message, request_id: str) -> dict[str, Any]:
        if message.error is not None:
            raise MCPError(message.error.code, message.error.message, message.error.data)
        result = message.result
        if message.id != request_id or result is None:
            raise Lost("the server's answer is not the call's")
        try:
            msgspec.convert(result, _ToolResult)
        except msgspec.ValidationError as exc:
            raise MCPError(INTERNAL_ERROR, f"MCP server '{self.server.name}' answered with a "
                                           f"malformed tool result: {exc}") from None
        if result.get("resultType", "complete") != "complete":
            raise MCPError(INTERNAL_ERROR, f"MCP server '{self.server.name}' asked for input "
                                           "the gateway cannot give")
        result.setdefault("isError", False)
        return result

    def _cancel(self, request_id: str, headers: dict[str, str]) -> None:
        """Tell a 2025-11-25 server the call is cancelled, beside the caller's unwinding."""
        body = msgspec.json.encode({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                    "params": {"requestId": request_id,
                                               "reason": "the gateway's caller cancelled"}})
        told = {name: value for name, value in headers.items()
                if name not in (MCP_METHOD_HEADER, MCP_NAME_HEADER)}

        async def tell() -> None:
            try:
                async with asyncio.timeout(CANCEL_WITHIN):
                    answer = await self.transport.request(
                        "POST", self.url, headers=told, body=body, link=self.link,
                        connect_timeout=CANCEL_WITHIN)
                    answer.close()
            except Exception:  # a courtesy: the call is over either way
                pass

        task = asyncio.create_task(tell())
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)
