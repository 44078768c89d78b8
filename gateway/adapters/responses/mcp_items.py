"""A Responses request's `mcp` tools, and the items the gateway's tool loop answers with, in
OpenAI's shapes (pure): `mcp_list_tools`, `mcp_call`, and the function tools and input items
the model is given in their place."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import msgspec

from gateway.adapters.mcp_loop import Asked, result_text, unknown_server
from gateway.adapters.responses.reply import new_id
from providers.contract.errors import InvalidRequest

MAX_OUTPUT_CHARS = 1_000_000  # of a tool's result as the model and the client get it


def asked(body: dict[str, Any], servers: Collection[str]) -> list[tuple[int, Asked]]:
    """The request's `mcp` tools that name a gateway MCP server, with their places in `tools`;
    InvalidRequest naming the field for a label the gateway does not serve, or an approval it
    cannot ask for."""
    tools = body.get("tools")
    found = []
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        if not isinstance(tool, dict) or tool.get("type") != "mcp":
            continue
        if tool.get("server_url") is not None or tool.get("connector_id") is not None:
            continue  # a server of the upstream's own, for an upstream that runs MCP
        where = f"tools[{index}]"
        label = tool.get("server_label")
        if not isinstance(label, str) or label not in servers:
            raise InvalidRequest(unknown_server(label), param=f"{where}.server_label")
        if tool.get("require_approval", "never") != "never":
            raise InvalidRequest("The gateway runs MCP tools without approvals: "
                                 "`require_approval` must be \"never\"",
                                 param=f"{where}.require_approval")
        allowed = _allowed(tool.get("allowed_tools"), where)
        found.append((index, Asked(label, label) if allowed is None else
                      Asked(label, label, False, dict.fromkeys(allowed, True))))
    return found


def _allowed(value: Any, where: str) -> frozenset[str] | None:
    names = value.get("tool_names") if isinstance(value, dict) else value
    if value is None or (isinstance(value, dict) and names is None):
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise InvalidRequest("`allowed_tools` must list tool names", param=f"{where}.allowed_tools")
    return frozenset(names)


def list_item(label: str, tools: list[dict[str, Any]], error: str | None = None
              ) -> dict[str, Any]:
    """An `mcp_list_tools` item of `tools` (MCP's shape, under their upstream names)."""
    shown = [{"name": tool["name"], "description": tool.get("description"),
              "input_schema": tool.get("inputSchema") or {"type": "object"},
              "annotations": tool.get("annotations")} for tool in tools]
    return {"type": "mcp_list_tools", "id": new_id("mcpl"), "server_label": label,
            "tools": shown, "error": error}


def function_tool(name: str, tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool as a Responses function tool named `name` (its namespaced name)."""
    shown = {"type": "function", "name": name,
             "parameters": tool.get("inputSchema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        shown["description"] = tool["description"]
    return shown


def call_item(label: str, tool: str, arguments: str, status: str = "in_progress"
              ) -> dict[str, Any]:
    """An `mcp_call` item, before its result."""
    return {"type": "mcp_call", "id": new_id("mcp"), "server_label": label, "name": tool,
            "arguments": arguments, "output": None, "error": None, "status": status}


def with_result(item: dict[str, Any], result: dict[str, Any] | None, failure: str | None
                ) -> dict[str, Any]:
    """The `mcp_call` item once its call ended: its output, or its error."""
    if result is None:
        error: dict[str, Any] = {"type": "mcp_protocol_error", "code": -32603,
                                 "message": (failure or "the call failed")[:2000]}
        return {**item, "error": error, "status": "failed"}
    output = result_text(result, MAX_OUTPUT_CHARS)
    if result.get("isError"):
        return {**item, "output": output, "status": "failed",
                "error": {"type": "mcp_tool_execution_error",
                          "content": result.get("content") or []}}
    return {**item, "output": output, "status": "completed"}


def arguments_of(text: str) -> dict[str, Any] | None:
    """A function call's arguments as the tool takes them; None when they are not an object."""
    try:
        value = msgspec.json.decode(text or "{}")
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


def as_input(items: Any) -> list[Any]:
    """The request's `input` as a list of items (a string is one user message)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return list(items)
