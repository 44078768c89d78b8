"""The Responses API's `mcp` tools for any model: the gateway runs the loop.

A request naming `{"type": "mcp", "server_label": <a gateway MCP server>}` is rewritten: the
server's tools its key may call (and `allowed_tools` names) become function tools, each round
is an ordinary request through the rest of the stack (routing, failover, budgets), each call
the model asks for is made through the gateway's MCP hub as the caller's key, and its result is
fed back; up to `mcp.max_tool_rounds` rounds, then the model answers without tools. The answer
carries OpenAI's `mcp_list_tools` and `mcp_call` items before the model's own output; a
stream's items are sent as they happen (`tool_events`).

Built only when llms.json has an MCP server; a request without gateway `mcp` tools passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncGenerator, Callable, Collection, Iterator, Mapping
from typing import Any

import msgspec

from gateway.adapters.responses import mcp_items as items
from gateway.adapters.responses.tool_events import streamed
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.delivery import Streamed, Whole
from gateway.core.settings.mcp import McpSettings
from gateway.core.tools import ToolHub
from providers.contract.errors import GatewayError

# What the loop tells as it goes: ("added" | "done", item), ("round", None) after each model
# answer, ("answer", (response, delivery)) at the end, ("failed", delivery) when a round failed.
Event = tuple[str, Any]
IDEMPOTENCY_KEY = "idempotency-key"


def tool_loop(hub_of: Callable[[], ToolHub | None], settings: McpSettings,
              servers: Collection[str]) -> Stage:
    """The stage that runs the tool loop of a Responses request naming gateway `mcp` tools
    (`servers`: the configured MCP servers' names)."""

    async def stage(call: Call, following: Next) -> Delivery:
        hub, outgoing = hub_of(), call.outgoing
        if hub is None or outgoing is None or outgoing.content_type is not None:
            return await following(call)
        asks = items.asked(outgoing.json(), servers)
        if not asks:
            return await following(call)
        loop = _Loop(hub, call, asks, settings.max_tool_rounds)
        events = loop.run(following)
        if not outgoing.stream:
            return await _whole(events)
        early: list[Event] = []
        async for event in events:  # up to the first answer: a failure is still an HTTP error
            if event[0] == "failed":
                await events.aclose()
                return event[1]  # type: ignore[no-any-return]
            early.append(event)
            if event[0] in ("round", "answer"):
                break
        return Streamed(streamed(loop.body, early, events), {}, call.record)

    return stage


async def _whole(events: AsyncGenerator[Event, None]) -> Delivery:
    done: list[dict[str, Any]] = []
    async for kind, value in events:
        if kind == "failed":
            return value  # type: ignore[no-any-return]
        if kind == "done":
            done.append(value)
        elif kind == "answer":
            response, whole = value
            response["output"] = done
            answered: Whole = dataclasses.replace(whole, body=msgspec.json.encode(response))
            return answered
    return None


class _Loop:
    """One request's loop: its tools listed once, then rounds of model calls and tool calls."""

    def __init__(self, hub: ToolHub, call: Call, asks: list[items.Asked], rounds: int) -> None:
        assert call.outgoing is not None
        self.hub, self.call, self.asks, self.rounds = hub, call, asks, rounds
        self.original = call.outgoing
        self.headers = call.headers
        self.body = call.outgoing.json()
        # Namespaced function name → (server label, the tool's upstream name).
        self.named: dict[str, tuple[str, str]] = {}
        self.functions: list[dict[str, Any]] = []
        self.added: list[dict[str, Any]] = []  # the input items the rounds add

    async def run(self, following: Next) -> AsyncGenerator[Event, None]:
        """The loop, told as it goes (`Event`)."""
        for ask in self.asks:
            yield "done", await self._listed(ask)
        usage: dict[str, Any] | None = None
        for number in range(self.rounds + 1):
            delivery = await self._round(following, number)
            if not isinstance(delivery, Whole) or delivery.status != 200:
                yield "failed", delivery
                return
            try:
                response = msgspec.json.decode(delivery.body)
            except msgspec.DecodeError:
                yield "failed", delivery
                return
            usage = items.summed(usage, response.get("usage"))
            output = response.get("output") or []
            ours = [item for item in output if item.get("type") == "function_call"
                    and item.get("name") in self.named]
            if not ours or number == self.rounds:
                break
            _billed_beside(self.call)
            yield "round", None
            for item in output:
                if item.get("type") == "message":
                    self.added.append(item)
                    yield "done", item
            for item in ours:
                async for event in self._called(item):
                    yield event
        response["output"] = [item for item in output if item.get("type") != "function_call"
                              or item.get("name") not in self.named]
        for item in response["output"]:
            yield "done", item
        response["tools"] = self.body.get("tools") or []
        if usage is not None:
            response["usage"] = usage
        yield "answer", (response, delivery)

    async def _listed(self, ask: items.Asked) -> dict[str, Any]:
        """The server's tools the key may call and the request allows, as an `mcp_list_tools`
        item; each becomes a function tool the model is given."""
        listing = await self.hub.list_tools(self.call.key, server=ask.label)
        names = {self.hub.tool_name(ask.label, tool): tool for tool in ask.allowed or ()}
        prefix = self.hub.tool_name(ask.label, "")
        shown = []
        for tool in listing.tools:
            name = tool["name"]
            upstream = names.get(name) if ask.allowed is not None else name.removeprefix(prefix)
            if upstream is None or name in self.named:
                continue
            self.named[name] = (ask.label, upstream)
            self.functions.append(items.function_tool(name, tool))
            shown.append({**tool, "name": upstream})
        error = f"MCP server '{ask.label}' is unavailable" if listing.unavailable else None
        return items.list_item(ask.label, shown, error)

    async def _round(self, following: Next, number: int) -> Delivery:
        """One model call through the rest of the stack, given the tools and the rounds so far
        (the last one asked to answer without tools). A keyed request's rounds are keyed each
        (a retry replays the model's answers; the tools are called again)."""
        last = number == self.rounds
        gateway_tools = {ask.index for ask in self.asks}
        tools = [tool for number, tool in enumerate(self.body.get("tools") or ())
                 if number not in gateway_tools] + self.functions
        body = {**self.body, "input": items.as_input(self.body.get("input")) + self.added,
                "stream": False}
        body.pop("stream_options", None)
        if tools:
            body["tools"] = tools
        else:
            body.pop("tools", None)
        if last and tools:
            body["tool_choice"] = "none"
        raw = msgspec.json.encode(body)
        self.call.raw = raw
        if (sent := self.headers.get(IDEMPOTENCY_KEY)) is not None:
            derived = hashlib.sha256(f"{sent}\0{number}".encode()).hexdigest()
            self.call.headers = _Rekeyed(self.headers, derived)
        self.call.outgoing = dataclasses.replace(self.original, raw=raw, _json=body,
                                                 stream=False)
        return await following(self.call)

    async def _called(self, asked: dict[str, Any]) -> AsyncGenerator[Event, None]:
        """The tool call the model asked for, made as the caller's key, and its result given
        back to the model."""
        label, tool = self.named[asked["name"]]
        arguments = asked.get("arguments") or "{}"
        item = items.call_item(label, tool, arguments)
        yield "added", item
        result: dict[str, Any] | None = None
        failure = None
        parsed = items.arguments_of(arguments)
        if parsed is None:
            failure = "The arguments are not a JSON object"
        else:
            try:
                result = await self.hub.call_tool(self.call.key, asked["name"], parsed)
            except GatewayError:  # the key's tool-call limit or budget: the request ends there
                raise
            except Exception as exc:  # unknown, unavailable, timed out: the model is told
                failure = str(exc) or type(exc).__name__
        item = items.with_result(item, result, failure)
        yield "done", item
        call_id = asked.get("call_id") or item["id"]
        self.added += [
            {"type": "function_call", "call_id": call_id, "name": asked["name"],
             "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id,
             "output": item["output"] if item["output"] is not None
             else f"Error: {item['error'].get('message', 'the call failed')}"}]


class _Rekeyed(Mapping[str, str]):
    """The request's headers with its `Idempotency-Key` replaced (by one of a round's)."""

    def __init__(self, headers: Mapping[str, str], key: str) -> None:
        self.headers, self.key = headers, key

    def __getitem__(self, name: str) -> str:
        return self.key if name.lower() == IDEMPOTENCY_KEY else self.headers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.headers)

    def __len__(self) -> int:
        return len(self.headers)


def _billed_beside(call: Call) -> None:
    """A round that asked for tools is billed beside the answer: the next round's cost, and so
    the request's, includes it (`Record.used`), and the request's hold is settled with all."""
    record = call.record
    record.aside += max((record.cost or 0.0) - record.billed_aside(), 0.0)
