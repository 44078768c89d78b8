"""The Responses API's `mcp` tools for any model: the gateway runs the loop (`mcp_loop`).

A request naming `{"type": "mcp", "server_label": <a gateway MCP server>}` is rewritten: the
server's tools its key may call (and `allowed_tools` names) become function tools, and the
answer carries OpenAI's `mcp_list_tools` and `mcp_call` items before the model's own output;
a stream's items are sent as they happen (`tool_events`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Collection
from typing import Any

from gateway.adapters import mcp_loop
from gateway.adapters.mcp_loop import Event, Outcome, ToolAsk, Turn
from gateway.adapters.responses import mcp_items as items
from gateway.adapters.responses.tool_events import streamed
from gateway.core.call import Stage
from gateway.core.settings.mcp import McpSettings
from gateway.core.tools import ToolHub
from providers.contract.provider import Outgoing


def tool_loop(hub_of: Callable[[], ToolHub | None], settings: McpSettings,
              servers: Collection[str]) -> Stage:
    """The stage that runs the tool loop of a Responses request naming gateway `mcp` tools
    (`servers`: the configured MCP servers' names)."""

    def dialect_of(outgoing: Outgoing, _: ToolHub) -> Responses | None:
        body = outgoing.json()
        found = items.asked(body, servers)
        return Responses(body, found) if found else None

    return mcp_loop.mcp_loop(hub_of, settings, dialect_of)


class Responses:
    """A Responses request's loop: function tools offered, OpenAI's `mcp_*` items told."""

    def __init__(self, body: dict[str, Any], found: list[tuple[int, mcp_loop.Asked]]) -> None:
        self.body = body
        self.asks = [ask for _, ask in found]
        self.places = {index for index, _ in found}  # the `mcp` tools' places in `tools`

    def listed(self, ask: mcp_loop.Asked, shown: list[dict[str, Any]], error: str | None
               ) -> list[Event]:
        return [("done", items.list_item(ask.label, shown, error))]

    def offered(self, name: str, tool: dict[str, Any]) -> dict[str, Any]:
        return items.function_tool(name, tool)

    def round(self, added: list[Any], tools: list[dict[str, Any]], last: bool
              ) -> dict[str, Any]:
        kept = [tool for number, tool in enumerate(self.body.get("tools") or ())
                if number not in self.places] + tools
        body = {**self.body, "input": items.as_input(self.body.get("input")) + added,
                "stream": False}
        body.pop("stream_options", None)
        if kept:
            body["tools"] = kept
        else:
            body.pop("tools", None)
        if last and kept:
            body["tool_choice"] = "none"
        return body

    def turn(self, answer: dict[str, Any], ours: Collection[str]) -> Turn:
        output = answer.get("output") or []
        calls = []
        for item in output:
            if item.get("type") == "function_call" and item.get("name") in ours:
                text = item.get("arguments") or "{}"
                calls.append(ToolAsk(item["name"], item.get("call_id") or "", text,
                                     items.arguments_of(text)))
        return Turn(calls, [item for item in output if item.get("type") == "message"])

    def calling(self, outcome: Outcome) -> list[Event]:
        outcome.item = items.call_item(outcome.label, outcome.tool, outcome.asked.text)
        return [("added", outcome.item)]

    def called(self, outcome: Outcome) -> list[Event]:
        assert outcome.item is not None
        outcome.item = items.with_result(outcome.item, outcome.result, outcome.failure)
        return [("done", outcome.item)]

    def fed(self, turn: Turn, outcomes: list[Outcome]) -> list[Any]:
        added: list[Any] = list(turn.said)
        for outcome in outcomes:
            item = outcome.item
            assert item is not None
            call_id = outcome.asked.call_id or item["id"]
            told = item["output"] if item["output"] is not None \
                else f"Error: {item['error'].get('message', 'the call failed')}"
            added += [{"type": "function_call", "call_id": call_id, "name": outcome.asked.name,
                       "arguments": outcome.asked.text},
                      {"type": "function_call_output", "call_id": call_id, "output": told}]
        return added

    def final(self, answer: dict[str, Any], ours: Collection[str]) -> list[dict[str, Any]]:
        answer["output"] = [item for item in answer.get("output") or ()
                            if item.get("type") != "function_call" or item.get("name") not in ours]
        answer["tools"] = self.body.get("tools") or []
        return list(answer["output"])

    def whole(self, answer: dict[str, Any], done: list[dict[str, Any]]) -> dict[str, Any]:
        answer["output"] = done
        return answer

    def streamed(self, early: list[Event], events: AsyncGenerator[Event, None]
                 ) -> AsyncGenerator[bytes, None]:
        return streamed(self.body, early, events)
