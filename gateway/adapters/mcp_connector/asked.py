"""Which gateway MCP servers a Messages request names, and which of their tools it enables, as
Anthropic's MCP connector writes them (pure).

`mcp_servers: [{"type": "url", "url", "name", "tool_configuration", "authorization_token"}]`
names a server by its `name`, or by a `url` whose path ends in the gateway's own
`/mcp/{server}`. Its tools are enabled by `tool_configuration` (`enabled`, `allowed_tools`: the
2025-04-04 connector) and by the `mcp_toolset` tool naming it (`default_config`, `configs`: the
2025-11-20 one; its pinned listing `tools`: 2026-09-15, which the gateway lists again, so only
their names count); a tool is given to the model when all enable it. `authorization_token` is
never used: the gateway reaches its servers with their own credentials, as the caller's key.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from gateway.adapters.mcp_loop import Asked, unknown_server
from gateway.core.messages import typed_at
from providers.contract.errors import InvalidRequest

TOOLSET = "mcp_toolset"


class ToolConfiguration(msgspec.Struct):
    enabled: bool | None = None
    allowed_tools: list[str] | None = None


class ServerDefinition(msgspec.Struct):
    type: str
    url: str
    name: str
    tool_configuration: ToolConfiguration | None = None
    authorization_token: str | None = None


class ToolConfig(msgspec.Struct):
    enabled: bool | None = None
    defer_loading: bool | None = None


class PinnedTool(msgspec.Struct):
    name: str


class Toolset(msgspec.Struct):
    type: str
    mcp_server_name: str
    default_config: ToolConfig | None = None
    configs: dict[str, ToolConfig] | None = None
    tools: list[PinnedTool] | None = None  # a listing pinned (2026-09-15): only these


def asked(body: Mapping[str, Any], servers: Collection[str]) -> list[Asked]:
    """The servers the request's `mcp_servers` name (every one must be the gateway's), with
    the tools each enables; InvalidRequest naming the field at fault."""
    declared = body.get("mcp_servers")
    toolsets = _toolsets(body.get("tools"))
    if declared is None and not toolsets:
        return []
    if not isinstance(declared, list):
        raise InvalidRequest("`mcp_servers` must list the MCP servers the toolsets name",
                             param="mcp_servers")
    found: list[Asked] = []
    for index, value in enumerate(declared):
        where = f"mcp_servers[{index}]"
        entry = typed_at(value, ServerDefinition, where)
        if entry.type != "url":
            raise InvalidRequest("Only \"url\" MCP servers are supported", param=f"{where}.type")
        server = _server(entry, servers)
        if server is None:
            raise InvalidRequest(unknown_server(entry.name), param=f"{where}.name")
        if any(ask.label == entry.name for ask in found):
            raise InvalidRequest(f"Two MCP servers are named '{entry.name[:64]}'",
                                 param=f"{where}.name")
        default, tools = _configured(entry.tool_configuration)
        if (toolset := toolsets.pop(entry.name, None)) is not None:
            default, tools = _both(default, tools, *_enabled(toolset[1]))
            if (pinned := toolset[1].tools) is not None:
                default, tools = _both(default, tools, False,
                                       {tool.name: True for tool in pinned})
        found.append(Asked(entry.name, server, default, tools, unknown=f"{where}.name"))
    if toolsets:  # a toolset naming no server of the request's
        name, (where, _) = next(iter(toolsets.items()))
        raise InvalidRequest(unknown_server(name), param=f"{where}.mcp_server_name")
    return found


def _toolsets(tools: Any) -> dict[str, tuple[str, Toolset]]:
    """The request's `mcp_toolset` tools by the server they name, with where each is."""
    found: dict[str, tuple[str, Toolset]] = {}
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(tool, dict) and tool.get("type") == TOOLSET:
            where = f"tools[{index}]"
            toolset = typed_at(tool, Toolset, where)
            if toolset.mcp_server_name in found:
                raise InvalidRequest("Two MCP toolsets name one server",
                                     param=f"{where}.mcp_server_name")
            found[toolset.mcp_server_name] = (where, toolset)
    return found


def _server(entry: ServerDefinition, servers: Collection[str]) -> str | None:
    """The gateway server an entry names: its name, else its URL's `/mcp/{server}`."""
    if entry.name in servers:
        return entry.name
    parts = urlsplit(entry.url).path.rstrip("/").split("/")
    if len(parts) >= 2 and parts[-2] == "mcp" and parts[-1] in servers:
        return parts[-1]
    return None


def _configured(configuration: ToolConfiguration | None) -> tuple[bool, dict[str, bool]]:
    """What `tool_configuration` enables: every tool, none, or those it allows."""
    if configuration is None:
        return True, {}
    if configuration.enabled is False:
        return False, {}
    if configuration.allowed_tools is not None:
        return False, dict.fromkeys(configuration.allowed_tools, True)
    return True, {}


def _enabled(toolset: Toolset) -> tuple[bool, dict[str, bool]]:
    """What an `mcp_toolset` enables: its default, and each tool's own setting."""
    default = toolset.default_config.enabled if toolset.default_config is not None else None
    tools = {name: config.enabled for name, config in (toolset.configs or {}).items()
             if config.enabled is not None}
    return default is not False, tools


def _both(first: bool, first_tools: dict[str, bool], second: bool,
          second_tools: dict[str, bool]) -> tuple[bool, dict[str, bool]]:
    """Tools enabled only where both settings enable them."""
    names = first_tools.keys() | second_tools.keys()
    return first and second, {name: first_tools.get(name, first)
                              and second_tools.get(name, second) for name in names}
