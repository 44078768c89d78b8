"""One upstream MCP server, kept connected through the official SDK's client.

A remote server is reached by streamable HTTP (`httpx2`, the SDK's own client) with its
configured headers or the gateway's OAuth token, and once connected its tool calls are posted
directly through the gateway's transport (`gateway.mcp.posting`); a local one is spawned over
stdio with an environment of only what its `env` names, `PATH` and `HOME`. Either way one task
owns the connection (the SDK's client lives inside one task's context) and keeps it: when it is
lost (the process died, a call saw the transport fail, the periodic listing failed) it
reconnects, with a backoff that doubles up to `MAX_BACKOFF`. `stop()` ends it, and a spawned
process with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from functools import partial
from typing import Any, TypeVar

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import x_mcp_header_map
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.core.settings.mcp import McpServer
from gateway.mcp.names import namespaced
from gateway.mcp.oauth import ClientCredentials
from gateway.mcp.posting import SESSION, Lost, ToolPoster
from gateway.mcp.unavailable import TimedOut, Unavailable, UpstreamError
from providers.contract.errors import GatewayError
from providers.contract.log import get_logger
from providers.contract.redact import mask_credentials
from providers.contract.transport import Transport

FIRST_BACKOFF = 0.25
MAX_BACKOFF = 30.0
CHECK_EVERY = 15.0  # seconds between listings that keep the tools known and the link checked
LIST_TIMEOUT = 10.0
MAX_PAGES = 50
# What a spawned server inherits from the SDK beyond PATH and HOME, taken away again.
NOT_INHERITED = ("LOGNAME", "SHELL", "TERM", "USER")
Progress = ProgressFnT  # (progress, total, message) -> awaitable
_T = TypeVar("_T")


class Link:
    """One server's connection, kept by a task of its own."""

    def __init__(self, server: McpServer, transport: Transport | None = None) -> None:
        self.server = server
        self.state = "starting"  # starting, ready, down, stopped
        self.error: str | None = None
        self.restarts = 0
        self.since = time.time()
        self.tools: list[types.Tool] = []
        self._named: tuple[list[types.Tool], str, dict[str, str]] | None = None
        self.client: Client | None = None
        self._lost = asyncio.Event()
        self._stopping = False
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # A remote server's calls, once connected: posted directly (None: through the SDK).
        self.poster = ToolPoster.of(server, transport)
        self._session_id: str | None = None  # a 2025-11-25 server's, as its answers give it
        self._auth: ClientCredentials | None = None

    def start(self) -> None:
        """Connect, and keep connected until `stop`."""
        self._task = asyncio.create_task(self._keep(), name=f"mcp:{self.server.name}")

    async def ready(self, within: float) -> bool:
        """Whether the first connection is made within `within` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), within)
        return self.state == "ready"

    async def stop(self) -> None:
        """Close the connection (a spawned server is stopped) and end the task."""
        self._stopping = True
        self._lost.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self._task), 10.0)
            if not self._task.done():
                self._task.cancel()
        self.state = "stopped"

    async def _keep(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                async with AsyncExitStack() as stack:
                    client = await stack.enter_async_context(self._client(stack))
                    await self._list(client)
                    if self.poster is not None:
                        self.poster.agreed(client.protocol_version, self._session_id, self._auth)
                    self.client, self.state, self.error = client, "ready", None
                    self.since, failures = time.time(), 0
                    self._ready.set()
                    await self._watch(client)
            except Exception as exc:  # any failure to connect or to stay connected
                self.error = mask_credentials(f"{type(exc).__name__}: {exc}")[:300]
            finally:
                self.client, self._session_id = None, None
                if self.poster is not None:
                    self.poster.agreed(None, None, None)
            if self._stopping:
                return
            failures += 1
            self.restarts += 1
            self.state, self.since = "down", time.time()
            self._ready.set()  # whoever waits for the first connection learns it failed
            delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (failures - 1))
            get_logger().warning("mcp_server_down", server=self.server.name, error=self.error,
                                 retry_in_s=delay)
            self._lost.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), delay)  # `stop` cuts it short

    async def _watch(self, client: Client) -> None:
        """Until the link is lost or stopped: the tools listed again now and then."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), CHECK_EVERY)
            if self._lost.is_set():
                if not self._stopping:
                    raise Unavailable(self.error or "the connection was lost")
                return
            await self._list(client)

    def _client(self, stack: AsyncExitStack) -> Client:
        server = self.server
        if server.command:
            args = [arg for name in NOT_INHERITED if name not in dict(server.env)
                    for arg in ("-u", name)]
            params = StdioServerParameters(command="env", args=[*args, "--", *server.command],
                                           env=dict(server.env))
            return Client(params, cache=None, message_handler=self._heard)
        assert server.url is not None
        auth = self._auth = ClientCredentials(server.oauth) if server.oauth is not None else None
        http = httpx2.AsyncClient(
            headers={name: value.reveal() for name, value in server.headers}, auth=auth,
            timeout=httpx2.Timeout(30.0, read=server.timeout + 30.0), trust_env=True,
            event_hooks={"response": [self._answered]})
        stack.push_async_callback(http.aclose)
        transport = streamable_http_client(server.url, http_client=http,
                                           max_sse_event_size=server.max_result_bytes * 2)
        return Client(transport, cache=None, message_handler=self._heard)

    async def _answered(self, response: httpx2.Response) -> None:
        """The session id a 2025-11-25 server gives, kept for the calls posted directly."""
        if session_id := response.headers.get(SESSION):
            self._session_id = session_id

    async def _heard(self, message: Any) -> None:
        """A server's notification: its tools changed, so the next look lists them again."""
        if isinstance(message, types.ServerNotification) \
                and getattr(message, "method", "") == "notifications/tools/list_changed":
            self.tools = []

    async def _list(self, client: Client) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        async with asyncio.timeout(min(LIST_TIMEOUT, self.server.timeout)):
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
        self.tools = tools
        if self.poster is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self.poster.header_maps = {tool.name: mapped for tool in tools
                                       if (mapped := x_mcp_header_map(tool.input_schema))}
        return tools

    async def listed(self) -> list[types.Tool]:
        """The server's tools, listed now; Unavailable when it cannot say."""
        client = self._live()
        try:
            return await self._list(client)
        except (MCPError, TimeoutError, httpx2.HTTPError, OSError) as exc:
            raise self._failed(exc) from exc

    def known(self) -> list[types.Tool]:
        """The tools as last listed (the connection's first listing, the periodic one)."""
        return self.tools

    def named(self, separator: str) -> dict[str, str]:
        """The tools as last listed by their namespaced names: name to upstream name (made
        again when a listing or the separator changes)."""
        tools, made = self.tools, self._named
        if made is None or made[0] is not tools or made[1] != separator:
            found = {namespaced(self.server.name, tool.name, separator): tool.name
                     for tool in reversed(tools)}  # the first of a name wins, as it did
            made = self._named = (tools, separator, found)
        return made[2]

    async def call(self, tool: str, arguments: dict[str, Any] | None,
                   progress: Progress | None) -> tuple[dict[str, Any], int | None]:
        """Call `tool` within the server's timeout: its `CallToolResult` as JSON, and the
        size of the message it was read from when posted directly (None through the SDK);
        the server's JSON-RPC error as UpstreamError, the rest as `asked` raises them."""
        poster = self.poster

        async def ask(client: Client) -> tuple[dict[str, Any], int | None]:
            if poster is not None and poster.ready:
                poster.bounded(self.server.max_result_bytes)
                return await poster.call(tool, arguments, progress)
            result = await client.call_tool(tool, arguments, progress_callback=progress)
            return result.model_dump(mode="json", by_alias=True, exclude_none=True), None

        try:
            return await self.asked(ask)
        except MCPError as exc:  # the server's own error, told as the gateway's
            raise UpstreamError(exc.code, exc.error.message) from exc

    def _live(self) -> Client:
        if self.client is None or self.state != "ready":
            raise Unavailable(f"MCP server '{self.server.name}' is unavailable"
                              + (f": {self.error}" if self.error else ""))
        return self.client

    def _failed(self, exc: BaseException) -> Unavailable:
        """The link is marked lost (its task reconnects); what the caller is told."""
        self.error = mask_credentials(f"{type(exc).__name__}: {exc}")[:300]
        self._lost.set()
        return Unavailable(f"MCP server '{self.server.name}' failed: {self.error}")

    # Tool calls, prompts and resources (`gateway.mcp.catalog`): asked of the live client apart
    # from the link's own upkeep, which they never change but to mark it lost when its
    # transport failed.
    async def asked(self, ask: Callable[[Client], Awaitable[_T]], within: float | None = None
                    ) -> _T:
        """One request of the server within `within` seconds (its timeout by default); its
        JSON-RPC error raised as `MCPError`, the transport's failure or the timeout as
        Unavailable."""
        client = self._live()
        limit = within if within is not None else self.server.timeout
        try:
            async with asyncio.timeout(limit):
                return await ask(client)
        except TimeoutError:
            raise TimedOut(f"MCP server '{self.server.name}' did not answer within "
                           f"{limit:g}s") from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                raise self._failed(exc) from exc
            raise
        except (httpx2.HTTPError, OSError, GatewayError, Lost) as exc:
            raise self._failed(exc) from exc

    async def offered(self, kind: str) -> list[Any]:
        """The server's prompts, resources or resource templates (`kind`, one of `OFFERED`),
        listed now: none when its capabilities offer none; Unavailable when it cannot say."""
        capabilities = self._live().server_capabilities
        if (capabilities.prompts if kind == "prompts" else capabilities.resources) is None:
            return []
        found: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            items, cursor = await self.asked(partial(_page, kind=kind, cursor=cursor),
                                             min(LIST_TIMEOUT, self.server.timeout))
            found += items
            if not cursor:
                break
        return found

    def view(self) -> dict[str, Any]:
        """What the status page and `ls` show of it."""
        return {"name": self.server.name, "state": self.state, "tools": len(self.tools),
                "transport": "stdio" if self.server.command else "http",
                "restarts": self.restarts, "error": self.error, "since": self.since}


OFFERED = ("prompts", "resources", "resourceTemplates")  # what a server offers, as MCP names it


async def _page(client: Client, kind: str, cursor: str | None) -> tuple[list[Any], str | None]:
    if kind == "prompts":
        prompts = await client.list_prompts(cursor=cursor)
        return list(prompts.prompts), prompts.next_cursor
    if kind == "resources":
        resources = await client.list_resources(cursor=cursor)
        return list(resources.resources), resources.next_cursor
    templates = await client.list_resource_templates(cursor=cursor)
    return list(templates.resource_templates), templates.next_cursor
