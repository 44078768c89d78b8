"""Every configured MCP server as one, for one key: its tools under namespaced names, those its
allow-lists deny left out, each call governed (`governance`). In-process callers (the edge's
`/mcp`, and a model's MCP tool loop) use `list_tools` and `call_tool` with the key they act for.

The servers follow the live config: `follow` compares the snapshot's `mcp_servers` with what
runs and starts, stops or reconnects links so they match, as a reload changes providers.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.core.call import Identity
from gateway.core.settings.mcp import McpServer
from gateway.guardrails.screening import GuardrailViolation
from gateway.mcp.allowed import Lists, allows, lists_of
from gateway.mcp.audit import AuditRows
from gateway.mcp.governance import Governed
from gateway.mcp.guarding import ToolGuard, ToolScreen
from gateway.mcp.names import namespaced
from gateway.mcp.unavailable import TimedOut, Unavailable
from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError

if TYPE_CHECKING:  # the SDK is imported by a gateway that has MCP servers, only
    import mcp_types as types

    from gateway.mcp.upstream import Link, Progress

UNAVAILABLE_META = "llms-gateway/unavailable"  # `_meta` of a listing: servers that could not say
STARTING = 30.0  # seconds a request waits for the MCP servers' links to be made at all
# The most a result's JSON grows when encoded again from what it was read from: a number
# spelled short comes back long ("1e15" is 1000000000000000.0), and `isError` may be added.
GROWTH = 5
FIRST_CONNECT = 10.0  # seconds a listing waits for a server's first connection (a call: its
# server's timeout)


class ToolUnknown(Exception):
    """No tool of that name for this key: unknown, or denied (the same error, on purpose)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"Unknown tool: {name[:128]}")


@dataclass(slots=True)
class Listing:
    """What a key may see: the tools as clients get them, and the servers that could not say."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)


class Hub:
    """The process's upstream MCP servers, kept in step with the live config."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.links: dict[str, Link] = {}
        self._applied: tuple[McpServer, ...] | None = None
        # Tool calls' audit rows, written in batches (`run_audit`).
        self.audited = AuditRows(runtime.accounts.db.engine if runtime.accounts else None,
                                 lambda text: runtime.live.redactor.text(text))
        self._applied_once = asyncio.Event()  # the first config's links exist
        self._loading = asyncio.Lock()
        self._upstream: ModuleType | None = None  # `gateway.mcp.upstream`, once imported
        # The guardrails of tool calls, compiled per snapshot.
        self.guard = ToolGuard(runtime.entity_models)

    @property
    def separator(self) -> str:
        return self.runtime.live.snapshot.mcp.separator

    def tool_name(self, server: str, tool: str) -> str:
        """The namespaced name of `server`'s tool `tool` (`gateway.mcp.names`)."""
        return namespaced(server, tool, self.separator)

    async def apply(self, servers: tuple[McpServer, ...], wait: float = 0.0) -> None:
        """Links for exactly `servers`: new ones started, gone ones stopped, changed ones
        connected again (waiting up to `wait` seconds for the new ones' first connection)."""
        if servers is self._applied:
            return
        wanted = {server.name: server for server in servers}
        for name in [n for n, link in self.links.items()
                     if n not in wanted or link.server.identity != wanted[n].identity]:
            await self.links.pop(name).stop()
        started = []
        upstream = await self.loaded() if wanted else None
        for name, server in wanted.items():
            if name in self.links:
                self.links[name].server = server  # its timeout, bounds and prices
                continue
            assert upstream is not None
            link = self.links[name] = upstream.Link(server, self.runtime.transport)
            link.start()
            started.append(link)
        if wait and started:
            await asyncio.gather(*(link.ready(wait) for link in started))
        self.links = {name: self.links[name] for name in wanted}  # in the file's order
        self._applied = servers
        self._applied_once.set()

    async def loaded(self) -> ModuleType:
        """The SDK and the links' module, imported once, in a thread: their first import takes
        seconds, which the event loop must not wait through, and one import at a time (two
        threads importing the SDK at once can deadlock on its module locks)."""
        if self._upstream is not None:  # every request to `/mcp` asks
            return self._upstream
        async with self._loading:
            if self._upstream is None:
                self._upstream = await asyncio.to_thread(_import_sdk)
            return self._upstream

    async def follow(self) -> None:
        """Forever: the links kept in step with the live config (a reload within a beat)."""
        while True:
            await self.apply(self.runtime.live.snapshot.mcp_servers)
            await asyncio.sleep(self.runtime.live.snapshot.server.reload_interval)

    async def close(self) -> None:
        """Stop every link (spawned servers with them) and write the audit rows left."""
        for link in self.links.values():
            await link.stop()
        self.links = {}
        await self.audited.flush()

    async def run_audit(self) -> None:
        """Forever: tool calls' audit rows written once a second."""
        await self.audited.run()

    async def started(self) -> None:
        """Once the links of the config the gateway started with exist (`follow` makes them
        beside the start, not before it: the SDK's first import takes seconds), or
        Unavailable after `STARTING` seconds."""
        if not self._applied_once.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied_once.wait(), STARTING)
        if not self._applied_once.is_set():
            raise Unavailable("The gateway's MCP servers are still starting: retry shortly")

    def _links(self, server: str | None) -> Iterable[Link]:
        if server is None:
            return self.links.values()
        found = self.links.get(server)
        return (found,) if found is not None else ()

    async def list_tools(self, identity: Identity | None, server: str | None = None
                         ) -> Listing:
        """The tools `identity` may call, of every server (or of `server` alone), listed now
        and in parallel; the servers that could not answer are named, not waited for."""
        lists = lists_of(identity)
        try:
            await self.started()
        except Unavailable:  # none is connected yet: each is named, none waited for longer
            return Listing(unavailable=[spec.name for spec in self.runtime.live.snapshot.
                                        mcp_servers if server in (None, spec.name)])
        links = list(self._links(server))
        found = await asyncio.gather(*(self._listed(link) for link in links))
        listing = Listing()
        for link, tools in zip(links, found, strict=True):
            if tools is None:
                if self._may_see(link, lists):
                    listing.unavailable.append(link.server.name)
                continue
            for tool in tools:
                name = namespaced(link.server.name, tool.name, self.separator)
                if allows(lists, name):
                    shown = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
                    shown["name"] = name
                    listing.tools.append(shown)
        return listing

    @staticmethod
    async def _listed(link: Link) -> list[types.Tool] | None:
        if link.state == "starting":  # just started or reloaded: its first connection
            await link.ready(FIRST_CONNECT)
        with contextlib.suppress(Unavailable):
            return await link.listed()
        return None

    def _may_see(self, link: Link, lists: Lists) -> bool:
        """Whether a key would see a server that is down: it has no allow-list, or one of
        the server's tools last known passes it."""
        return not lists or any(
            allows(lists, namespaced(link.server.name, tool.name, self.separator))
            for tool in link.known())

    def may_use(self, identity: Identity | None, server: str) -> bool:
        """Whether `identity` may call some tool of `server`, as last listed (a server it may
        not use is, to it, one that does not exist)."""
        link = self.links.get(server)
        return link is not None and self._may_see(link, lists_of(identity))

    def find(self, identity: Identity | None, name: str, server: str | None = None
             ) -> tuple[Link, str]:
        """The link and upstream tool name behind `name` for `identity`; ToolUnknown when there
        is none or its allow-list denies it (which a caller cannot tell apart); Unavailable when
        the name is an allowed one of a server that is not connected."""
        if not allows(lists_of(identity), name):
            raise ToolUnknown(name)
        separator = self.separator
        for link in self._links(server):
            if (tool_name := link.named(separator).get(name)) is not None:
                return link, tool_name
            prefix = f"{link.server.name}{separator}"
            if name.startswith(prefix) and link.state != "ready":  # its tools are not known
                raise Unavailable(f"MCP server '{link.server.name}' is unavailable"
                                  + (f": {link.error}" if link.error else ""))
        raise ToolUnknown(name)

    async def call_tool(self, identity: Identity | None, name: str,
                        arguments: dict[str, Any] | None = None, *,
                        progress: Progress | None = None, server: str | None = None
                        ) -> dict[str, Any]:
        """Call the tool `name` as `identity`: the `CallToolResult` as JSON, its arguments and
        result screened by the key's guardrails. Raises ToolUnknown, Unavailable (down, failed,
        or past the server's timeout), UpstreamError, GuardrailViolation, or a GatewayError
        (429: the key's limit or budget)."""
        await self.started()
        starting = [link.ready(link.server.timeout) for link in self._links(server)
                    if link.state == "starting"]
        if starting:  # just started or reloaded: their first connections, and their tools
            await asyncio.gather(*starting)
        link, tool = self.find(identity, name, server)
        spec = link.server
        governed = Governed(self.runtime, self.audited, identity, spec.name, tool, name,
                            arguments, spec.price_of(tool))
        try:
            await governed.admit()
        except GatewayError as exc:
            governed.end(exc.code, exc.status)
            raise
        outcome, status = "error", 502
        in_force = self.guard.in_force(self.runtime.live.snapshot, identity)
        screen = ToolScreen(in_force) if in_force else None
        try:
            if screen is not None:
                governed.arguments = None  # until screened: a blocked value is never kept
                arguments = governed.arguments = screen.arguments(arguments)
            with governed.span():
                shown, read = await link.call(tool, arguments, progress)
            if (size := _over(shown, read, spec.max_result_bytes)) is not None:
                outcome = "too_large"
                return _failed(f"The result of {name} is {size} bytes, over the "
                               f"{spec.max_result_bytes} its server may return")
            if screen is not None:
                shown = screen.result(shown)
            outcome, status = ("tool_error" if shown.get("isError") is True else "completed"), 200
            return shown
        except GuardrailViolation:
            outcome, status = GuardrailViolation.code, 400
            raise
        except Unavailable as exc:
            outcome = "timeout" if isinstance(exc, TimedOut) else "unavailable"
            raise
        except asyncio.CancelledError:
            outcome, status = "cancelled", 499
            raise
        finally:
            if screen is not None:
                governed.guarded(screen.header())
                screen.publish(self.runtime.metrics, self.runtime.guardrails)
            governed.end(outcome, status)

    def view(self) -> list[dict[str, Any]]:
        """Each server's state and tool count (the status page, `/status.json`, `ls`)."""
        return [link.view() for link in self.links.values()]


def _import_sdk() -> ModuleType:
    """The links' module, and the SDK's parts the edge reads requests with."""
    importlib.import_module("mcp.shared.inbound")
    return importlib.import_module("gateway.mcp.upstream")


def _over(result: dict[str, Any], read: int | None, most: int) -> int | None:
    """The size of `result` as JSON when over `most`; None when within it (known without
    encoding it again when the message it was `read` from was small enough)."""
    if read is not None and read * GROWTH + 64 <= most:
        return None
    size = len(msgspec.json.encode(result))
    return size if size > most else None


def _failed(message: str) -> dict[str, Any]:
    """A tool result that tells the model the call failed (`isError`)."""
    return {"content": [{"type": "text", "text": message}], "isError": True}
