"""Anthropic's MCP connector for any model: a Messages request's `mcp_servers` naming gateway MCP
servers run as the gateway's tool loop (`mcp_loop`).

The servers' tools become ordinary tools of each round (namespaced names, their MCP schemas),
and the answer carries Anthropic's `mcp_tool_use` and `mcp_tool_result` blocks where the model
called them, its own text around them (and, under the 2026-09-15 connector's beta, an
`mcp_tool_listing` block per server first); a stream sends each block as it happens (`events`).
A conversation that goes on sends those blocks back: the model gets them as the `tool_use` and
`tool_result` turns they stand for.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from typing import Any

import msgspec

from gateway.adapters import mcp_loop
from gateway.adapters.mcp_connector import events
from gateway.adapters.mcp_connector.asked import TOOLSET, asked
from gateway.adapters.mcp_loop import Event, Outcome, ToolAsk, Turn
from gateway.core.call import Stage
from gateway.core.settings.mcp import McpSettings
from gateway.core.tools import ToolHub
from providers.contract.provider import Outgoing
from providers.contract.spec import betas_in

MAX_OUTPUT_CHARS = 1_000_000  # of a tool's result as the model and the client get it
USE, RESULT, LISTING = "mcp_tool_use", "mcp_tool_result", "mcp_tool_listing"
LISTING_BETA = "mcp-client-2026-09-15"  # the connector whose answers tell what was listed


def connector(hub_of: Callable[[], ToolHub | None], settings: McpSettings,
              servers: Collection[str]) -> Stage:
    """The stage that runs the tool loop of a Messages request whose `mcp_servers` name gateway
    MCP servers (`servers`: the configured ones' names)."""

    def dialect_of(outgoing: Outgoing, hub: ToolHub) -> Messages | None:
        body = outgoing.json()
        found = asked(body, servers)
        listing = LISTING_BETA in betas_in(outgoing.betas or "")
        return Messages(body, found, hub, listing) if found else None

    return mcp_loop.mcp_loop(hub_of, settings, dialect_of)


class Messages:
    """A Messages request's loop: tools offered, Anthropic's `mcp_*` blocks told."""

    def __init__(self, body: dict[str, Any], asks: list[mcp_loop.Asked], hub: ToolHub,
                 listing: bool = False) -> None:
        self.body = body
        self.asks = asks
        self.listing = listing  # whether the answer tells each server's tools, as it lists
        servers = {ask.label: ask.server for ask in asks}

        def named(label: str, tool: str) -> str:
            server = servers.get(label)
            return hub.tool_name(server, tool) if server is not None else tool

        self.history = as_turns(body.get("messages") or [], named)

    def listed(self, ask: mcp_loop.Asked, shown: list[dict[str, Any]], error: str | None
               ) -> list[Event]:
        if not self.listing:  # before the 2026-09-15 connector, no answer told it
            return []
        tools = [{"name": tool["name"], "description": tool.get("description"),
                  "input_schema": tool.get("inputSchema") or {"type": "object"}}
                 for tool in shown]
        return [("done", {"type": LISTING, "mcp_server_name": ask.label, "tools": tools})]

    def offered(self, name: str, tool: dict[str, Any]) -> dict[str, Any]:
        offered = {"name": name, "input_schema": tool.get("inputSchema")
                   or {"type": "object", "properties": {}}}
        if tool.get("description"):
            offered["description"] = tool["description"]
        return offered

    def round(self, added: list[Any], tools: list[dict[str, Any]], last: bool
              ) -> dict[str, Any]:
        body = {name: value for name, value in self.body.items() if name != "mcp_servers"}
        body["messages"] = self.history + added
        body["stream"] = False
        kept = [tool for tool in self.body.get("tools") or ()
                if not isinstance(tool, dict) or tool.get("type") != TOOLSET] + tools
        if kept:
            body["tools"] = kept
        else:
            body.pop("tools", None)
            body.pop("tool_choice", None)
        if last and kept:
            body["tool_choice"] = {"type": "none"}
        return body

    def turn(self, answer: dict[str, Any], ours: Collection[str]) -> Turn:
        content = answer.get("content") or []
        calls = [ToolAsk(block["name"], block.get("id") or "",
                         msgspec.json.encode(block.get("input")).decode(),
                         block.get("input") if isinstance(block.get("input"), dict) else None)
                 for block in content
                 if block.get("type") == "tool_use" and block.get("name") in ours]
        return Turn(calls, [block for block in content if block.get("type") != "tool_use"])

    def calling(self, outcome: Outcome) -> list[Event]:
        outcome.item = {"type": USE, "id": f"mcptoolu_{os.urandom(12).hex()}",
                        "name": outcome.tool, "server_name": outcome.label,
                        "input": outcome.asked.arguments or {}}
        return [("done", outcome.item)]

    def called(self, outcome: Outcome) -> list[Event]:
        assert outcome.item is not None
        result, failed = outcome.result, outcome.result is None or outcome.result.get("isError")
        text = mcp_loop.result_text(result, MAX_OUTPUT_CHARS) if result is not None \
            else (outcome.failure or "the call failed")[:2000]
        texts = [part for part in (result or {}).get("content") or ()
                 if isinstance(part, dict) and part.get("type") == "text"]
        if result is None or len(texts) != len(result.get("content") or ()) or not texts:
            shown = [{"type": "text", "text": text}]
        else:
            shown = [{"type": "text", "text": part.get("text", "")} for part in texts]
        return [("done", {"type": RESULT, "tool_use_id": outcome.item["id"],
                          "is_error": bool(failed), "content": shown})]

    def fed(self, turn: Turn, outcomes: list[Outcome]) -> list[Any]:
        uses, results = [], []
        for outcome in outcomes:
            assert outcome.item is not None
            call_id = outcome.asked.call_id or outcome.item["id"]
            uses.append({"type": "tool_use", "id": call_id, "name": outcome.asked.name,
                         "input": outcome.asked.arguments or {}})
            told = mcp_loop.result_text(outcome.result, MAX_OUTPUT_CHARS) \
                if outcome.result is not None else (outcome.failure or "the call failed")
            results.append({"type": "tool_result", "tool_use_id": call_id, "content": told,
                            "is_error": outcome.result is None
                            or bool(outcome.result.get("isError"))})
        return [{"role": "assistant", "content": [*turn.said, *uses]},
                {"role": "user", "content": results}]

    def final(self, answer: dict[str, Any], ours: Collection[str]) -> list[dict[str, Any]]:
        content = [block for block in answer.get("content") or ()
                   if block.get("type") != "tool_use" or block.get("name") not in ours]
        if answer.get("stop_reason") == "tool_use" \
                and not any(block.get("type") == "tool_use" for block in content):
            answer["stop_reason"] = "end_turn"  # the calls left were the gateway's, unmade
        answer["content"] = content
        return content

    def whole(self, answer: dict[str, Any], done: list[dict[str, Any]]) -> dict[str, Any]:
        answer["content"] = done
        return answer

    def streamed(self, early: list[Event], told: AsyncGenerator[Event, None]
                 ) -> AsyncGenerator[bytes, None]:
        return events.streamed(str(self.body.get("model") or ""), early, told)


def as_turns(messages: list[Any], named: Callable[[str, str], str]) -> list[Any]:
    """The conversation as a model without MCP reads it: an assistant turn's `mcp_tool_use`
    blocks as its `tool_use` (named as the gateway offers the tool), each `mcp_tool_result` as
    the user turn's `tool_result` that follows it, the turn going on after; its
    `mcp_tool_listing` blocks left out."""
    turns: list[Any] = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if message.get("role") != "assistant" or not isinstance(content, list) \
                or not any(isinstance(b, dict) and b.get("type") in (USE, RESULT, LISTING)
                           for b in content):
            turns.append(message)
            continue
        said: list[Any] = []
        results: list[Any] = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == LISTING:  # what the gateway listed then: it lists again
                continue
            if kind == RESULT:
                results.append({"type": "tool_result", "tool_use_id": block.get("tool_use_id"),
                                "content": block.get("content") or "",
                                "is_error": bool(block.get("is_error"))})
                continue
            if results:  # the turn goes on after its calls' results
                turns += _turn(said, results)
                said, results = [], []
            if kind == USE:
                said.append({"type": "tool_use", "id": block.get("id"),
                             "name": named(str(block.get("server_name")), str(block.get("name"))),
                             "input": block.get("input") or {}})
            else:
                said.append(block)
        turns += _turn(said, results)
    return turns


def _turn(said: list[Any], results: list[Any]) -> list[dict[str, Any]]:
    return ([{"role": "assistant", "content": said}] if said else []) \
        + ([{"role": "user", "content": results}] if results else [])
