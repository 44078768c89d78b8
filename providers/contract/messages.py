"""Anthropic's Messages API and OpenAI chat completions, translated both ways (pure).

One vocabulary for both directions: the `anthropic` kind sends chat requests out as Messages
(`STOP_REASONS`, `usage_of`, `image_block`, `THINKING_BUDGETS` read its answers), and the
gateway's own `POST /v1/messages` takes Messages in and sends them to any chat provider
(`to_chat`, `to_message`, `MessageEvents`), mapping through the same tables inverted. It lives in
the contract because both sides use it and the app may not import a kind.

Approximated inbound: thinking blocks in the history are dropped (a chat provider cannot take
them back), `top_k` and `cache_control` are dropped, a `tool_result`'s images are not sent,
server tools (web search and the like) are refused with a 400.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec

from providers.contract.chat import NonEmptyStr, checked
from providers.contract.errors import InvalidRequest

# Anthropic's stop reasons as OpenAI finish reasons, and back (the first of each wins).
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}
FINISH_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                  "function_call": "tool_use", "content_filter": "refusal"}
# Reasoning effort as a thinking budget (outbound), and a budget as the effort it buys (inbound).
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}


# -- the request, typed as the inbound translation reads it ------------------------------------


class Source(msgspec.Struct):
    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class Block(msgspec.Struct):
    """A content block of any type: the fields the translation reads, by type."""

    type: NonEmptyStr
    text: str | None = None
    source: Source | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None


class InboundMessage(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDefinition(msgspec.Struct):
    name: NonEmptyStr
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None


class Metadata(msgspec.Struct):
    user_id: str | None = None


class CountTokensRequest(msgspec.Struct):
    """`POST /v1/messages/count_tokens`: a Messages request without `max_tokens`."""

    model: NonEmptyStr
    messages: Annotated[list[InboundMessage], msgspec.Meta(min_length=1)]
    system: str | list[Block] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`: every field the translation reads, typed; others pass untouched."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 0
    stream: bool | None = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: Metadata | None = None

    def __post_init__(self) -> None:
        if self.max_tokens == 0:  # required, as Anthropic requires it
            raise msgspec.ValidationError("Object missing required field `max_tokens`")


# -- pieces both directions share ---------------------------------------------------------------


def image_block(url: str) -> dict[str, Any]:
    """An image content block for an OpenAI image URL (a data URL becomes base64)."""
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[5:].partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def image_url(source: Mapping[str, Any]) -> str:
    """The OpenAI image URL for an image block's source (`image_block` inverted)."""
    if source.get("type") == "base64":
        return f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data', '')}"
    return str(source.get("url") or "")


def usage_of(anthropic_usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Anthropic usage in OpenAI's names; cache reads count as cached prompt tokens."""
    found = anthropic_usage or {}
    cached = found.get("cache_read_input_tokens") or 0
    prompt = (found.get("input_tokens") or 0) + cached + \
        (found.get("cache_creation_input_tokens") or 0)
    completion = found.get("output_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def anthropic_usage(chat_usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """OpenAI usage in Anthropic's names (`usage_of` inverted)."""
    found = chat_usage or {}
    cached = (found.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": max(0, (found.get("prompt_tokens") or 0) - cached),
            "output_tokens": found.get("completion_tokens") or 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def effort_for(budget: int | None) -> str:
    """The reasoning effort whose budget is the smallest that covers `budget`."""
    for effort in ("low", "medium", "high"):
        if budget is not None and budget <= THINKING_BUDGETS[effort]:
            return effort
    return "high" if budget is not None else "medium"


def new_id() -> str:
    return f"msg_{os.urandom(12).hex()}"


# -- inbound: a Messages request as a chat completion, and the answer back ----------------------


def to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions body for a Messages body; InvalidRequest names a wrong field."""
    checked(body, MessagesRequest if "max_tokens" in body else CountTokensRequest)
    messages: list[dict[str, Any]] = []
    if system := _text(body.get("system")):
        messages.append({"role": "system", "content": system})
    for message in body["messages"]:
        messages += _chat_messages(message["role"], message["content"])
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("max_tokens"):
        chat["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if body.get("tools"):
        chat.update(_chat_tools(body["tools"], body.get("tool_choice")))
    thinking = body.get("thinking") or {}
    if thinking.get("type") in ("enabled", "adaptive"):
        chat["reasoning_effort"] = effort_for(thinking.get("budget_tokens"))
    if user := (body.get("metadata") or {}).get("user_id"):
        chat["user"] = user
    return chat


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n\n".join(block.get("text") or "" for block in content or ()
                       if block.get("type") == "text")


def _chat_messages(role: str, content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: an assistant turn with its tool calls, or a user
    turn's tool results (each its own `tool` message, first) and then what the user said."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        calls = [{"id": block.get("id") or "", "type": "function",
                  "function": {"name": block.get("name") or "",
                               "arguments": json.dumps(block.get("input") or {})}}
                 for block in content if block["type"] == "tool_use"]
        answer: dict[str, Any] = {"role": "assistant", "content": _text(content) or None}
        if calls:
            answer["tool_calls"] = calls
        return [answer]
    results = [{"role": "tool", "tool_call_id": block.get("tool_use_id") or "",
                "content": ("Error: " if block.get("is_error") else "")
                + _text(block.get("content"))}
               for block in content if block["type"] == "tool_result"]
    parts = [{"type": "text", "text": block.get("text") or ""} if block["type"] == "text"
             else {"type": "image_url", "image_url": {"url": image_url(block["source"])}}
             for block in content
             if block["type"] == "text" or (block["type"] == "image" and block.get("source"))]
    if not parts:
        return results
    if all(part["type"] == "text" for part in parts):
        return [*results, {"role": "user", "content": "".join(str(p["text"]) for p in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _chat_tools(tools: Sequence[Mapping[str, Any]], choice: Mapping[str, Any] | None
                ) -> dict[str, Any]:
    declared: dict[str, Any] = {"tools": [_function(tool, n) for n, tool in enumerate(tools)]}
    if choice is not None:
        declared["tool_choice"] = _chat_tool_choice(choice)
        if choice.get("disable_parallel_tool_use"):
            declared["parallel_tool_calls"] = False
    return declared


def _function(tool: Mapping[str, Any], number: int) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise InvalidRequest(f"Server tool '{tool['type']}' is not available through the "
                             "gateway: declare client tools with an input_schema",
                             param=f"tools[{number}].type")
    function = {"name": tool["name"],
                "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Mapping[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name") or ""}}
    return {"any": "required"}.get(kind, kind)


def stop_reason(choice: Mapping[str, Any], stop_sequences: Sequence[str] | None
                ) -> tuple[str, str | None]:
    """Anthropic's stop reason (and matched stop sequence) for a chat choice. Servers that
    say which stop string matched (vLLM's `stop_reason`) give `stop_sequence`."""
    finish = choice.get("finish_reason") or "stop"
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return FINISH_REASONS.get(finish, "end_turn"), None


def _arguments(text: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(text or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def to_message(chat: Mapping[str, Any], model: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API answer for a chat completion (its first choice)."""
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    said = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reasoning := said.get("reasoning_content") or said.get("reasoning"):
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if said.get("content"):
        content.append({"type": "text", "text": said["content"]})
    for call in said.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or new_id(),
                        "name": function.get("name") or "",
                        "input": _arguments(function.get("arguments"))})
    reason, sequence = stop_reason(choice, request.get("stop_sequences"))
    return {"id": new_id(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": anthropic_usage(chat.get("usage"))}


def event(kind: str, payload: Mapping[str, Any]) -> bytes:
    """One Messages stream event: its name and its JSON."""
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(
        {"type": kind, **payload}) + b"\n\n"


class MessageEvents:
    """Chat-completion chunks in (decoded), Messages stream events out: `message_start` and a
    `ping` first, a content block per kind of output (thinking, text, each tool call), and
    `message_delta` + `message_stop` from `finish()`, once the upstream's usage is known."""

    def __init__(self, model: str, request: Mapping[str, Any]) -> None:
        self.model = model
        self.stop_sequences = request.get("stop_sequences")
        self.id = new_id()
        self.started = False
        self.open: tuple[str, int] | None = None  # the open block: its kind and index
        self.blocks = 0
        self.calls: dict[int, int] = {}  # a chat tool call's index → its block's index
        self.finish_choice: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        out = []
        if not self.started:
            self.started = True
            out.append(event("message_start", {"message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}))
            out.append(event("ping", {}))
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # Messages answers have one choice
            delta = choice.get("delta") or {}
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                out.append(self._into("thinking", {"type": "thinking", "thinking": "",
                                                    "signature": ""}))
                out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
            if delta.get("content"):
                out.append(self._into("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                out.append(self._tool(call))
            if choice.get("finish_reason"):
                self.finish_choice = dict(choice)
        return b"".join(out)

    @property
    def finished(self) -> bool:
        return self.finish_choice is not None

    def finish(self) -> bytes:
        """The closing events; call once the upstream is done and `finished` is true."""
        out = [self._close()]
        reason, sequence = stop_reason(self.finish_choice or {}, self.stop_sequences)
        usage = anthropic_usage(self.usage)
        out.append(event("message_delta", {"delta": {"stop_reason": reason,
                                                     "stop_sequence": sequence},
                                           "usage": usage}))
        out.append(event("message_stop", {}))
        return b"".join(out)

    def _into(self, kind: str, block: dict[str, Any]) -> bytes:
        if self.open is not None and self.open[0] == kind:
            return b""
        closed = self._close()
        self.open = (kind, self.blocks)
        self.blocks += 1
        return closed + event("content_block_start", {"index": self.open[1],
                                                      "content_block": block})

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        at = index if index is not None else (self.open[1] if self.open else 0)
        return event("content_block_delta", {"index": at, "delta": delta})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        closed, self.open = self.open[1], None
        return event("content_block_stop", {"index": closed})

    def _tool(self, call: Mapping[str, Any]) -> bytes:
        number = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        if number not in self.calls:
            out = self._into(f"tool_use:{number}", {
                "type": "tool_use", "id": call.get("id") or new_id(),
                "name": function.get("name") or "", "input": {}})
            self.calls[number] = self.blocks - 1
        if arguments := function.get("arguments"):
            out += self._delta({"type": "input_json_delta", "partial_json": arguments},
                               self.calls[number])
        return out
