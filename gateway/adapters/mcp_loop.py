"""MCP tools for any model: the gateway runs the tool loop, for any API that names gateway MCP
servers (`Dialect`: the Responses API's `mcp` tools, the Messages API's `mcp_servers`).

The servers' tools the key may call (and the request allows) become the API's ordinary tools,
each round is an ordinary request through the rest of the stack (routing, failover, budgets),
each call the model asks for is made through the gateway's MCP hub as the caller's key, and its
result is fed back; up to `mcp.max_tool_rounds` rounds, then the model answers without tools.
The dialect says it all in its API's items or blocks, whole or as a stream, as it happens.

Built only when llms.json has an MCP server; a request naming no gateway server passes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncGenerator, Callable, Collection, Iterator, Mapping
from typing import Any, Protocol

import msgspec

from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.delivery import Streamed, Whole
from gateway.core.settings.mcp import McpSettings
from gateway.core.tools import ToolHub
from providers.contract.errors import GatewayError, InvalidRequest
from providers.contract.provider import Outgoing

# What the loop tells as it goes: ("added" | "done", item), ("round", None) after each model
# answer, ("answer", (answer, delivery)) at the end, ("failed", delivery) when a round failed.
Event = tuple[str, Any]
IDEMPOTENCY_KEY = "idempotency-key"


@dataclasses.dataclass(frozen=True, slots=True)
class Asked:
    """One gateway MCP server a request names: `label` as the request and the answer call it,
    `server` the hub's (None: every server the key may use), and which of its tools (by the
    names it shows) the request enables: `default`, unless `tools` says otherwise."""

    label: str
    server: str | None
    default: bool = True
    tools: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    # The field naming it, when a server the key may not use must look unknown (a 400 on it).
    unknown: str | None = None

    def enables(self, tool: str) -> bool:
        """Whether the request lets the model call `tool`."""
        return self.tools.get(tool, self.default)


@dataclasses.dataclass(frozen=True, slots=True)
class ToolAsk:
    """A call of one of the gateway's tools the model asked for: the tool's namespaced name,
    its call's id, its arguments as sent and as an object (None: not an object)."""

    name: str
    call_id: str
    text: str
    arguments: dict[str, Any] | None


@dataclasses.dataclass(slots=True)
class Outcome:
    """One tool call as the loop makes it: what was asked, of which server and tool, what the
    dialect showed of it so far (`item`), and its result or why it failed."""

    asked: ToolAsk
    label: str
    tool: str
    item: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    failure: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    """A model's answer read: the calls of the gateway's tools, and what else it said before
    them (shown to the client, and fed back with the calls)."""

    calls: list[ToolAsk]
    said: list[dict[str, Any]]


class Dialect(Protocol):
    """How one API's request names gateway MCP servers, and its answer tells the loop."""

    asks: list[Asked]

    def listed(self, ask: Asked, shown: list[dict[str, Any]], error: str | None
               ) -> list[Event]:
        """What the answer tells of a server's tools (`shown`: under the names it shows)."""
        ...

    def offered(self, name: str, tool: dict[str, Any]) -> dict[str, Any]:
        """An MCP tool as the model is given it, named `name`."""
        ...

    def round(self, added: list[Any], tools: list[dict[str, Any]], last: bool
              ) -> dict[str, Any]:
        """A round's body: the request's, the conversation the rounds `added`, `tools` offered
        (the gateway's in place of the MCP servers), the last one asked to answer without."""
        ...

    def turn(self, answer: dict[str, Any], ours: Collection[str]) -> Turn:
        """The model's answer read: its calls of the tools named `ours`."""
        ...

    def calling(self, outcome: Outcome) -> list[Event]:
        """What the answer tells of a call as it starts."""
        ...

    def called(self, outcome: Outcome) -> list[Event]:
        """What the answer tells of a call once it ended."""
        ...

    def fed(self, turn: Turn, outcomes: list[Outcome]) -> list[Any]:
        """The conversation the next round adds: the model's turn, and the calls' results."""
        ...

    def final(self, answer: dict[str, Any], ours: Collection[str]) -> list[dict[str, Any]]:
        """The last answer's own output, as the client gets it."""
        ...

    def whole(self, answer: dict[str, Any], done: list[dict[str, Any]]) -> dict[str, Any]:
        """The whole answer: the last round's, its output all that was told."""
        ...

    def streamed(self, early: list[Event], events: AsyncGenerator[Event, None]
                 ) -> AsyncGenerator[bytes, None]:
        """The answer as its API streams it, from the loop's events as they come."""
        ...


class Writer(Protocol):
    """How one API writes the loop's events as its stream (`written`)."""

    def opened(self) -> bytes: ...

    def told(self, event: Event) -> bytes: ...

    def failed(self, exc: Exception) -> bytes: ...


async def written(writer: Writer, early: list[Event], events: AsyncGenerator[Event, None]
                  ) -> AsyncGenerator[bytes, None]:
    """The SSE body for the loop's `early` events (already told), then the rest of `events`;
    a failure mid-stream said in-band by `writer`, never a cut."""
    yield writer.opened()
    try:
        for event in early:
            yield writer.told(event)
        async for event in events:
            yield writer.told(event)
    except Exception as exc:
        yield writer.failed(exc)
    finally:
        await events.aclose()


def unknown_server(name: object) -> str:
    """The error of a server name the gateway does not serve (or the key may not use)."""
    return f"No MCP server named '{str(name)[:64]}' is configured on this gateway"


def mcp_loop(hub_of: Callable[[], ToolHub | None], settings: McpSettings,
             dialect_of: Callable[[Outgoing, ToolHub], Dialect | None]) -> Stage:
    """The stage that runs the tool loop of a request whose `dialect_of` is not None (it
    raises InvalidRequest for gateway servers named wrongly)."""

    async def stage(call: Call, following: Next) -> Delivery:
        hub, outgoing = hub_of(), call.outgoing
        if hub is None or outgoing is None or outgoing.content_type is not None:
            return await following(call)
        dialect = dialect_of(outgoing, hub)
        if dialect is None:
            return await following(call)
        loop = Loop(hub, call, dialect, settings.max_tool_rounds)
        events = loop.run(following)
        if not outgoing.stream:
            return await _whole(dialect, events)
        early: list[Event] = []
        async for event in events:  # up to the first answer: a failure is still an HTTP error
            if event[0] == "failed":
                await events.aclose()
                return event[1]  # type: ignore[no-any-return]
            early.append(event)
            if event[0] in ("round", "answer"):
                break
        return Streamed(dialect.streamed(early, events), {}, call.record)

    return stage


async def _whole(dialect: Dialect, events: AsyncGenerator[Event, None]) -> Delivery:
    done: list[dict[str, Any]] = []
    async for kind, value in events:
        if kind == "failed":
            return value  # type: ignore[no-any-return]
        if kind == "done":
            done.append(value)
        elif kind == "answer":
            answer, whole = value
            body = msgspec.json.encode(dialect.whole(answer, done))
            answered: Whole = msgspec.structs.replace(whole, body=body)
            return answered
    return None


class Loop:
    """One request's loop: its tools listed once, then rounds of model calls and tool calls."""

    def __init__(self, hub: ToolHub, call: Call, dialect: Dialect, rounds: int) -> None:
        assert call.outgoing is not None
        self.hub, self.call, self.dialect, self.rounds = hub, call, dialect, rounds
        self.original = call.outgoing
        self.headers = call.headers
        # Namespaced tool name → (the server's label, the tool's name as the answer shows it).
        self.named: dict[str, tuple[str, str]] = {}
        self.functions: list[dict[str, Any]] = []
        self.added: list[Any] = []  # the conversation the rounds add

    async def run(self, following: Next) -> AsyncGenerator[Event, None]:
        """The loop, told as it goes (`Event`)."""
        for ask in self.dialect.asks:
            for event in await self._listed(ask):
                yield event
        usage: dict[str, Any] | None = None
        for number in range(self.rounds + 1):
            delivery = await self._round(following, number)
            if not isinstance(delivery, Whole) or delivery.status != 200:
                yield "failed", delivery
                return
            try:
                answer = msgspec.json.decode(delivery.body)
            except msgspec.DecodeError:
                yield "failed", delivery
                return
            usage = summed(usage, answer.get("usage"))
            turn = self.dialect.turn(answer, self.named)
            if not turn.calls or number == self.rounds:
                break
            _billed_beside(self.call)
            yield "round", None
            for item in turn.said:
                yield "done", item
            outcomes = []
            for asked in turn.calls:
                outcome = Outcome(asked, *self.named[asked.name])
                async for event in self._called(outcome):
                    yield event
                outcomes.append(outcome)
            self.added += self.dialect.fed(turn, outcomes)
        for item in self.dialect.final(answer, self.named):
            yield "done", item
        if usage is not None:
            answer["usage"] = usage
        yield "answer", (answer, delivery)

    async def _listed(self, ask: Asked) -> list[Event]:
        """The server's tools the key may call and the request enables, told by the dialect;
        each becomes a tool the model is given."""
        listing = await self.hub.list_tools(self.call.key, server=ask.server)
        if ask.unknown is not None and ask.server is not None \
                and not self.hub.may_use(self.call.key, ask.server):
            raise InvalidRequest(unknown_server(ask.label), param=ask.unknown)
        prefix = self.hub.tool_name(ask.server, "") if ask.server is not None else ""
        # The names the request gives, namespaced: a shortened name is found by them too.
        given = {self.hub.tool_name(ask.server, tool): tool for tool in ask.tools} \
            if ask.server is not None else {}
        shown = []
        for tool in listing.tools:
            name = tool["name"]
            visible = given.get(name) or name.removeprefix(prefix)
            if not ask.enables(visible) or name in self.named:
                continue
            self.named[name] = (ask.label, visible)
            self.functions.append(self.dialect.offered(name, tool))
            shown.append({**tool, "name": visible})
        error = f"MCP server '{ask.label}' is unavailable" if listing.unavailable else None
        return self.dialect.listed(ask, shown, error)

    async def _round(self, following: Next, number: int) -> Delivery:
        """One model call through the rest of the stack (the last one asked to answer without
        tools). A keyed request's rounds are keyed each (a retry replays the model's answers;
        the tools are called again)."""
        body = self.dialect.round(self.added, self.functions, number == self.rounds)
        raw = msgspec.json.encode(body)
        self.call.raw = raw
        if (sent := self.headers.get(IDEMPOTENCY_KEY)) is not None:
            derived = hashlib.sha256(f"{sent}\0{number}".encode()).hexdigest()
            self.call.headers = _Rekeyed(self.headers, derived)
        self.call.outgoing = dataclasses.replace(self.original, raw=raw, _json=body,
                                                 stream=False)
        return await following(self.call)

    async def _called(self, outcome: Outcome) -> AsyncGenerator[Event, None]:
        """The tool call the model asked for, made as the caller's key, told as it goes."""
        for event in self.dialect.calling(outcome):
            yield event
        asked = outcome.asked
        if asked.arguments is None:
            outcome.failure = "The arguments are not a JSON object"
        else:
            try:
                outcome.result = await self.hub.call_tool(self.call.key, asked.name,
                                                          asked.arguments)
            except GatewayError:  # the key's tool-call limit or budget: the request ends there
                raise
            except Exception as exc:  # unknown, unavailable, timed out: the model is told
                outcome.failure = str(exc) or type(exc).__name__
        for event in self.dialect.called(outcome):
            yield event


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


def summed(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two rounds' usage as one (every count added)."""
    if first is None or second is None:
        return second or first
    total: dict[str, Any] = {}
    for key in first.keys() | second.keys():
        a, b = first.get(key), second.get(key)
        if isinstance(a, dict) or isinstance(b, dict):
            total[key] = summed(a if isinstance(a, dict) else None,
                                b if isinstance(b, dict) else None)
        elif isinstance(a, int) or isinstance(b, int):
            total[key] = (a if isinstance(a, int) else 0) + (b if isinstance(b, int) else 0)
    return total


def result_text(result: dict[str, Any], limit: int) -> str:
    """A `CallToolResult` as the text the model reads: its text parts, else its structured
    content as JSON, else its content as JSON; at most `limit` characters."""
    content = result.get("content") or []
    texts = [part.get("text", "") for part in content
             if isinstance(part, dict) and part.get("type") == "text"]
    if texts and len(texts) == len(content):
        text = "\n".join(texts)
    elif result.get("structuredContent") is not None:
        text = msgspec.json.encode(result["structuredContent"]).decode()
    else:
        text = msgspec.json.encode(content).decode()
    return text[:limit]
