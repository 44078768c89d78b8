"""Anthropic's Messages API and OpenAI chat completions, translated both ways (pure).

One vocabulary for both directions: the `anthropic` kind sends chat requests out as Messages
(`STOP_REASONS`, `usage_of`, `image_block`, `THINKING_BUDGETS` read its answers), and the
gateway's own `POST /v1/messages` takes Messages in and sends them to any chat provider
(`to_chat`, `to_message`, `MessageEvents`), mapping through the same tables inverted. It lives in
the contract because both sides use it and the app may not import a kind.

The head (`MessagesRequest`) types only what routing reads, as Anthropic requires it: a native
provider gets every other field, block and role untouched and judges them itself. `to_chat`
checks what it translates, each block by its type, where it reads it.

Approximated inbound: `system` messages become chat system messages where they stand; thinking
blocks, server tool blocks and other blocks the chat format has no place for are dropped;
`top_k` and `context_management` are dropped, and `cache_control` too unless the provider
takes it (`to_chat(cache_control=True)`: Claude behind the `bedrock` or `vertex` kinds), when it
goes on the matching content part, message (an assistant turn's or a tool result's) or tool;
a deferred tool (`defer_loading`) is declared once a `tool_reference` has loaded it; a
`tool_result`'s images are not sent; server tools (web search and the like) are refused with a
400.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec

from providers.contract.chat import NonEmptyStr, Shape, checked
from providers.contract.errors import InvalidRequest

# Anthropic's stop reasons as OpenAI finish reasons, and back (the first of each wins).
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}
FINISH_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                  "function_call": "tool_use", "content_filter": "refusal"}
# Reasoning effort as a thinking budget (outbound), and a budget as the effort it buys (inbound).
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}
# Anthropic's `output_config.effort` as a chat reasoning effort.
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


# -- the head: what routing reads, for every provider ------------------------------------------


class Block(msgspec.Struct):
    """A content block of any type; what a type holds is checked where it is translated."""

    type: NonEmptyStr


class InboundMessage(msgspec.Struct):
    # Any role: Anthropic added `system` beside user and assistant, and may add more.
    role: NonEmptyStr
    content: str | list[Block]


class CountTokensRequest(msgspec.Struct):
    """`POST /v1/messages/count_tokens`: what routing reads; the rest passes untouched."""

    model: NonEmptyStr
    messages: Annotated[list[InboundMessage], msgspec.Meta(min_length=1)]


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`: what routing reads, as Anthropic requires it; the rest passes
    untouched to a native provider and is checked by the bridge where it translates it."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1)] = 0
    stream: bool | None = False

    def __post_init__(self) -> None:
        if self.max_tokens == 0:  # required, as Anthropic requires it
            raise msgspec.ValidationError("Object missing required field `max_tokens`")


# -- what the bridge reads, typed as Anthropic types it ----------------------------------------


class Source(msgspec.Struct):
    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class TextBlock(msgspec.Struct):
    text: str


class ImageBlock(msgspec.Struct):
    source: Source


class DocumentBlock(msgspec.Struct):
    source: Source
    title: str | None = None


class ToolUseBlock(msgspec.Struct):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct):
    tool_use_id: str
    content: str | list[Block] | None = None
    is_error: bool | None = None


class ToolReferenceBlock(msgspec.Struct):
    tool_name: str


# The block types the bridge reads, and what it reads of each; others are dropped unread.
BLOCKS: Mapping[str, type[msgspec.Struct]] = {
    "text": TextBlock, "image": ImageBlock, "document": DocumentBlock, "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock, "tool_reference": ToolReferenceBlock}


class ToolDefinition(msgspec.Struct):
    type: str | None = None
    name: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    defer_loading: bool | None = None


class ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct):
    type: str
    budget_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None


class OutputConfig(msgspec.Struct):
    effort: str | None = None
    format: dict[str, Any] | None = None


class Metadata(msgspec.Struct):
    user_id: str | None = None


class Translated(msgspec.Struct):
    """Every top-level field `to_chat` reads; blocks are checked by type as they are read."""

    messages: list[InboundMessage]
    system: str | list[Block] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: Metadata | None = None


def typed_at(value: Any, shape: type[Shape], where: str) -> Shape:
    """`value` converted to `shape`; InvalidRequest names the wrong field below `where`."""
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as exc:
        problem, _, below = str(exc).partition(" - at `$")
        raise InvalidRequest.from_msgspec(msgspec.ValidationError(
            f"{problem} - at `$.{where}{below.rstrip('`')}`")) from None


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
    """Anthropic usage in OpenAI's names: every prompt token counts in `prompt_tokens` (as
    OpenAI counts them), cache reads as `cached_tokens`, cache writes as `cache_write_tokens`."""
    found = anthropic_usage or {}
    cached = found.get("cache_read_input_tokens") or 0
    written = found.get("cache_creation_input_tokens") or 0
    prompt = (found.get("input_tokens") or 0) + cached + written
    completion = found.get("output_tokens") or 0
    details = {"cached_tokens": cached}
    if written:
        details["cache_write_tokens"] = written
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion, "prompt_tokens_details": details}


def anthropic_usage(chat_usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """OpenAI usage in Anthropic's names (`usage_of` inverted)."""
    found = chat_usage or {}
    details = found.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    written = details.get("cache_write_tokens") or 0
    return {"input_tokens": max(0, (found.get("prompt_tokens") or 0) - cached - written),
            "output_tokens": found.get("completion_tokens") or 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": written}


def effort_for(budget: int | None) -> str:
    """The reasoning effort whose budget is the smallest that covers `budget`."""
    for effort in ("low", "medium", "high"):
        if budget is not None and budget <= THINKING_BUDGETS[effort]:
            return effort
    return "high" if budget is not None else "medium"


def new_id() -> str:
    return f"msg_{os.urandom(12).hex()}"


# -- inbound: a Messages request as a chat completion, and the answer back ----------------------


def to_chat(body: Mapping[str, Any], cache_control: bool = False) -> dict[str, Any]:
    """The chat-completions body for a Messages body; InvalidRequest names a field the
    translation cannot read. With `cache_control`, prompt-cache marks are kept."""
    checked(body, Translated)
    _check_blocks(body.get("system"), "system")
    for number, message in enumerate(body["messages"]):
        _check_blocks(message["content"], f"messages[{number}].content")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if cache_control and isinstance(system, list) and any(_mark(b) for b in system):
        messages.append({"role": "system", "content": [
            _keep_mark({"type": "text", "text": block["text"]}, block)
            for block in system if block["type"] == "text"]})
    elif text := _text(system):
        messages.append({"role": "system", "content": text})
    for number, message in enumerate(body["messages"]):
        messages += _chat_messages(message["role"], message["content"], f"messages[{number}]",
                                   cache_control)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, **_settings(body)}
    if body.get("tools"):
        chat.update(_chat_tools(body["tools"], body.get("tool_choice"),
                                _loaded(body["messages"]), cache_control))
    return chat


def _mark(block: Mapping[str, Any]) -> dict[str, Any] | None:
    found = block.get("cache_control")
    return found if isinstance(found, dict) else None


def _keep_mark(target: dict[str, Any], block: Mapping[str, Any]) -> dict[str, Any]:
    """`target` with `block`'s prompt-cache mark, if it has one."""
    if (found := _mark(block)) is not None:
        target["cache_control"] = found
    return target


def _settings(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's settings in the chat format's names."""
    chat: dict[str, Any] = {}
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
    output = body.get("output_config") or {}
    thinking = body.get("thinking") or {}
    if thinking.get("type") in ("enabled", "adaptive"):
        chat["reasoning_effort"] = EFFORTS.get(output.get("effort") or "") \
            or effort_for(thinking.get("budget_tokens"))
    if answer_format := _response_format(output.get("format") or body.get("output_format")):
        chat["response_format"] = answer_format
    if user := (body.get("metadata") or {}).get("user_id"):
        chat["user"] = user
    return chat


def _check_blocks(blocks: Any, where: str) -> None:
    """Each block of a type the bridge reads has what it reads, of the right types."""
    for number, block in enumerate(blocks if isinstance(blocks, list) else ()):
        if (shape := BLOCKS.get(block["type"])) is not None:
            typed_at(block, shape, f"{where}[{number}]")
        if block["type"] == "tool_result":
            _check_blocks(block.get("content"), f"{where}[{number}].content")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n\n".join(block["text"] for block in content or () if block["type"] == "text")


def _chat_messages(role: str, content: str | list[dict[str, Any]], where: str,
                   marks: bool = False) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a system message where it stands, an assistant turn
    with its tool calls, or a user turn's tool results (each its own `tool` message, first) and
    then what the user said; with `marks`, the blocks' `cache_control` on their parts (or, for
    an assistant turn or a tool result, on the message: its last block)."""
    if role == "system":
        text = _text(content)
        return [{"role": "system", "content": text}] if text else []
    if role not in ("user", "assistant"):
        raise InvalidRequest(f"A message of role '{role}' has no place in a chat completion",
                             param=f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        calls = [{"id": block["id"], "type": "function",
                  "function": {"name": block["name"], "arguments": json.dumps(block["input"])}}
                 for block in content if block["type"] == "tool_use"]
        answer: dict[str, Any] = {"role": "assistant", "content": _text(content) or None}
        if calls:
            answer["tool_calls"] = calls
        for block in content if marks else ():
            _keep_mark(answer, block)
        return [answer]
    results = [_keep_mark({"role": "tool", "tool_call_id": block["tool_use_id"],
                           "content": ("Error: " if block.get("is_error") else "")
                           + _text(block.get("content"))}, block if marks else {})
               for block in content if block["type"] == "tool_result"]
    parts = [_keep_mark(part, block if marks else {}) for block in content
             if (part := _part(block)) is not None]
    if not parts:
        return results
    if all(part["type"] == "text" and "cache_control" not in part for part in parts):
        return [*results, {"role": "user", "content": "".join(str(p["text"]) for p in parts)}]
    return [*results, {"role": "user", "content": parts}]


def _part(block: Mapping[str, Any]) -> dict[str, Any] | None:
    """A user block as a chat content part, if the chat format has a place for it."""
    kind, source = block["type"], block.get("source") or {}
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": image_url(source)}}
    if kind == "document" and source["type"] == "text":
        return {"type": "text", "text": source.get("data") or ""}
    if kind == "document" and source["type"] == "base64":
        data = f"data:{source.get('media_type') or 'application/pdf'};base64," \
            f"{source.get('data') or ''}"
        return {"type": "file", "file": {"filename": block.get("title") or "document.pdf",
                                         "file_data": data}}
    return None  # thinking, server tool results, a document by URL or file id


def _loaded(messages: Iterable[Mapping[str, Any]]) -> set[str]:
    """The deferred tools a tool search has loaded: those its `tool_reference` blocks name."""
    return {inner["tool_name"] for message in messages if isinstance(message["content"], list)
            for block in message["content"]
            if block["type"] == "tool_result" and isinstance(block.get("content"), list)
            for inner in block["content"] if inner["type"] == "tool_reference"}


def _chat_tools(tools: Sequence[Mapping[str, Any]], choice: Mapping[str, Any] | None,
                loaded: set[str], marks: bool = False) -> dict[str, Any]:
    # A deferred tool is not shown to an Anthropic model until a tool search loads it.
    functions = [_keep_mark(_function(tool, n), tool if marks else {})
                 for n, tool in enumerate(tools)
                 if not tool.get("defer_loading") or tool.get("name") in loaded]
    if not functions:
        return {}
    declared: dict[str, Any] = {"tools": functions}
    if choice is not None:
        declared["tool_choice"] = _chat_tool_choice(choice)
        if choice.get("disable_parallel_tool_use"):
            declared["parallel_tool_calls"] = False
    return declared


class ClientTool(msgspec.Struct):
    name: NonEmptyStr
    description: str | None = None
    input_schema: dict[str, Any] | None = None


def _function(tool: Mapping[str, Any], number: int) -> dict[str, Any]:
    if tool.get("type") not in (None, "custom"):
        raise InvalidRequest(f"Server tool '{tool['type']}' is not available through the "
                             "gateway: declare client tools with an input_schema",
                             param=f"tools[{number}].type")
    declared = typed_at(tool, ClientTool, f"tools[{number}]")
    function: dict[str, Any] = {
        "name": declared.name,
        "parameters": declared.input_schema or {"type": "object", "properties": {}}}
    if declared.description:
        function["description"] = declared.description
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Mapping[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name") or ""}}
    return {"any": "required"}.get(kind, kind)


def _response_format(found: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Structured output (`output_config.format`) as the chat format's `response_format`."""
    if not found or found.get("type") != "json_schema":
        return None
    return {"type": "json_schema", "json_schema": {"name": "output",
                                                   "schema": found.get("schema") or {}}}


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
