"""What a model's tool loop needs of the gateway's MCP servers (`gateway.mcp.hub.Hub` is one),
so a stage below `mcp` can run the loop without importing it."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.core.call import Identity


class ToolListing(Protocol):
    """The tools a key may see (as MCP lists them, namespaced), and the servers that could not
    say."""

    tools: list[dict[str, Any]]
    unavailable: list[str]


class ToolHub(Protocol):
    """Lists and calls the configured MCP servers' tools as one key."""

    async def list_tools(self, identity: Identity | None, server: str | None = None
                         ) -> ToolListing: ...

    async def call_tool(self, identity: Identity | None, name: str,
                        arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """The `CallToolResult` as JSON; raises when the call could not be made."""
        ...

    def tool_name(self, server: str, tool: str) -> str:
        """The namespaced name of `server`'s tool `tool`."""
        ...

    def may_use(self, identity: Identity | None, server: str) -> bool:
        """Whether `identity` may call some tool of `server` (one it may not is unknown to
        it)."""
        ...
