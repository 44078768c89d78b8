"""A Responses API request as a chat-completions body (pure).

`to_chat` starts by converting the body to `Bridged`, every field the bridge reads typed, so a
wrong type is a 400 naming the client's own field (`text.format.schema`), not one of the chat
body it would have become, and what the bridge hands the chat kind is what that kind can read.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from gateway.core.schemas import ResponsesHead, ResponsesTool, TextConfig
from providers.contract.chat import asked_output, checked
from providers.contract.errors import InvalidRequest

# Fields with the same name and meaning in both APIs.
_SAME = ("temperature", "top_p", "parallel_tool_calls", "user", "stream", "top_logprobs")


def _needs_name(kind: str, name: str | None) -> None:
    # Raised in `__post_init__`, msgspec adds the path: `tools[0]` → param `tools[0].name`.
    if kind == "function" and name is None:
        raise ValueError("Object missing required field `name`")


class BridgedTool(ResponsesTool):
    def __post_init__(self) -> None:
        _needs_name(self.type, self.name)


class FunctionChoice(msgspec.Struct):
    type: str
    name: str | None = None

    def __post_init__(self) -> None:
        _needs_name(self.type, self.name)


class TextFormat(msgspec.Struct):
    type: str
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class BridgedText(TextConfig):
    format: TextFormat | None = None  # type: ignore[assignment]  # narrower than the head's


class Bridged(ResponsesHead):
    """Every field the bridge reads of a Responses body, typed as the chat kinds read it. It
    narrows the head's types (the head leaves them open for a native Responses upstream)."""

    tools: list[BridgedTool] | None = None  # type: ignore[assignment]
    text: BridgedText | None = None
    tool_choice: str | FunctionChoice | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None


def to_chat(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The chat body for `body`, after `history` (messages of earlier turns) if given;
    InvalidRequest names a field of the wrong type."""
    checked(body, Bridged)
    messages: list[dict[str, Any]] = []
    if instructions := body.get("instructions"):
        messages.append({"role": "system", "content": instructions})
    messages += history or []
    messages += input_messages(body.get("input"))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    for name in _SAME:
        if body.get(name) is not None:
            chat[name] = body[name]
    if limit := asked_output(body):  # the largest asked, as the budget's hold assumed
        chat["max_tokens"] = limit
    if body.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    if (effort := (body.get("reasoning") or {}).get("effort")) is not None:
        chat["reasoning_effort"] = effort
    format_ = (body.get("text") or {}).get("format")
    if format_ is not None and (response_format := _response_format(format_)) is not None:
        chat["response_format"] = response_format
    if body.get("tools"):
        chat["tools"] = [_tool(tool) for tool in body["tools"]]
    if (choice := body.get("tool_choice")) is not None:
        chat["tool_choice"] = _tool_choice(choice)
    return chat


def input_items(items: Any, response_id: str) -> list[dict[str, Any]]:
    """The `input` as the item list `GET /v1/responses/{id}/input_items` answers: a string is a
    user message, content strings become parts, and each item has an id."""
    listed = [{"type": "message", "role": "user", "content": items}] \
        if isinstance(items, str) else list(items or ())
    found = []
    suffix = response_id.removeprefix("resp_")
    for number, item in enumerate(listed):
        kind = item.get("type") or "message"
        shown = {**item, "type": kind, "id": item.get("id") or f"{_ITEM_IDS.get(kind, 'item')}_"
                                                                f"{suffix}_{number}"}
        if kind == "message":
            if isinstance(shown.get("content"), str):
                part = "output_text" if shown.get("role") == "assistant" else "input_text"
                shown["content"] = [{"type": part, "text": shown["content"]}]
            shown.setdefault("status", "completed")
        found.append(shown)
    return found


_ITEM_IDS = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
             "reasoning": "rs"}


def input_messages(items: Any) -> list[dict[str, Any]]:
    """The `input` (a string or a list of items) as chat messages."""
    if items is None:
        return []
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments", "")}}
            previous = messages[-1] if messages else None
            if previous and previous["role"] == "assistant" and "tool_calls" in previous:
                previous["tool_calls"].append(call)  # parallel calls share one turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else str(output)})
        elif kind == "reasoning":
            continue  # chat models re-think each turn; earlier reasoning is not replayed
        else:
            raise InvalidRequest(f"input items of type '{kind}' are not supported for this "
                                 "model", param="input")
    return messages


def _content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    parts = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            image = {"url": part.get("image_url") or part.get("file_id", "")}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise InvalidRequest(f"content parts of type '{kind}' are not supported for this "
                                 "model", param="input")
    return parts


def _response_format(format_: dict[str, Any]) -> dict[str, Any] | None:
    kind = format_.get("type")
    if kind == "json_schema":
        schema = {key: format_[key] for key in ("name", "schema", "strict", "description")
                  if key in format_}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise InvalidRequest(f"tools of type '{tool.get('type')}' are not supported for this "
                             "model", param="tools")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict")
                if key in tool}
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice
