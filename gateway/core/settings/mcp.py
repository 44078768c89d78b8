"""The MCP gateway's settings types (`mcp_servers` and `mcp` in llms.json; `gateway.mcp`), kept
beside `settings.py`, which holds the snapshot that carries them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import msgspec

from providers.contract.spec import Secret

MiB = 1024 * 1024
DEFAULT_MCP_TIMEOUT = 60.0
DEFAULT_MCP_MAX_RESULT_BYTES = 4 * MiB
# A server's name is the prefix of its tools' names: short, and only what tool names allow.
SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$"


class McpOAuth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """OAuth client credentials the gateway trades for its own token to an upstream."""

    token_url: str
    client_id: str
    client_secret: str
    scope: str | None = None


class McpServerEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One upstream MCP server as llms.json writes it: remote (`url`) or spawned (`command`)."""

    url: str | None = None
    headers: dict[str, str] = {}
    oauth: McpOAuth | None = None
    command: tuple[str, ...] | None = None
    env: dict[str, str] = {}
    timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] = DEFAULT_MCP_TIMEOUT
    max_result_bytes: Annotated[int, msgspec.Meta(ge=1024, le=256 * MiB)] = \
        DEFAULT_MCP_MAX_RESULT_BYTES
    # US dollars a call costs, charged to budgets: every tool's, or per tool (by its own name).
    price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    tool_prices: dict[str, Annotated[float, msgspec.Meta(ge=0)]] = {}
    enabled: bool = True


class McpSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How the MCP gateway names and bounds what it serves (`mcp` in llms.json)."""

    # Between a server's name and its tool's: `docs_search`.
    separator: Annotated[str, msgspec.Meta(pattern=r"^[_-]{1,2}$")] = "_"
    # Tool calls one key may make per minute (None: no limit); a 429 with Retry-After past it.
    tool_calls_per_minute: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Rounds of tool calls the gateway runs for one Responses request naming `mcp` tools;
    # then the model is asked to answer without tools.
    max_tool_rounds: Annotated[int, msgspec.Meta(ge=1, le=64)] = 8
    # Old-revision sessions kept in memory (without Redis), and how long one lasts unused.
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    session_ttl: Annotated[float, msgspec.Meta(gt=0)] = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class McpServer:
    """One upstream MCP server, its secrets resolved (what `gateway.mcp` connects to)."""

    name: str
    url: str | None = None
    headers: tuple[tuple[str, Secret], ...] = ()
    oauth: McpOAuth | None = None  # its `client_secret` resolved
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout: float = DEFAULT_MCP_TIMEOUT
    max_result_bytes: int = DEFAULT_MCP_MAX_RESULT_BYTES
    price: float | None = None
    tool_prices: tuple[tuple[str, float], ...] = ()

    def price_of(self, tool: str) -> float | None:
        """What one call of `tool` (its upstream name) costs, in dollars; None: free."""
        return dict(self.tool_prices).get(tool, self.price)

    @property
    def identity(self) -> tuple[object, ...]:
        """What a live connection depends on: a reload that changes it reconnects."""
        return (self.url, tuple((k, v.reveal()) for k, v in self.headers), self.oauth,
                self.command, self.env)
