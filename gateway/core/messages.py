"""`POST /v1/messages` read: Anthropic's Messages request typed, and translated into a chat
completion for any chat provider (`to_chat`, pure).

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
from typing import Annotated, Any

import msgspec

from providers.contract.chat import NonEmptyStr, Shape, asked_output, checked
from providers.contract.errors import InvalidRequest
from providers.contract.messages import THINKING_BUDGETS, ToolChoice, image_url

# Anthropic's `output_config.effort` as a chat reasoning effort.
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high"}


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


def effort_for(budget: int | None) -> str:
    """The reasoning effort whose budget is the smallest that covers `budget`."""
    for effort in ("low", "medium", "high"):
        if budget is not None and budget <= THINKING_BUDGETS[effort]:
            return effort
    return "high" if budget is not None else "medium"


def new_id() -> str:
    return f"msg_{os.urandom(12).hex()}"


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
    if limit := asked_output(body):  # the largest asked, as the budget's hold assumed
        chat["max_tokens"] = limit
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
