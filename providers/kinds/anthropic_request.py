"""An OpenAI chat-completions body as Anthropic's Messages API request: pure, no I/O.

Approximated: `response_format` becomes an instruction in the system prompt (the Messages API
has no JSON mode), `n` > 1 and `logprobs` are not available, `seed` and penalties are dropped.

Prompt caching: a `cache_control` on a content part, on a message (its last block: LiteLLM's
convention) or on a tool goes on the matching block; past Anthropic's limit of
`MAX_BREAKPOINTS` per request, the earliest are dropped (`limit_breakpoints`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from providers.contract.chat import ChatRequest, asked_output, checked, content_text
from providers.contract.messages import THINKING_ROOM, image_block, thinking_budget

DEFAULT_MAX_TOKENS = 4096
# Anthropic refuses a request with more blocks marked `cache_control` than this (a 400).
MAX_BREAKPOINTS = 4


def to_messages(body: Mapping[str, Any], upstream_model: str) -> dict[str, Any]:
    """The Messages API request for an OpenAI chat-completions body; InvalidRequest names a
    field of the wrong type."""
    checked(body, ChatRequest)  # what follows reads only fields of the types checked here
    system, messages = _conversation(body.get("messages") or ())
    request: dict[str, Any] = {
        "model": upstream_model, "messages": messages,
        "max_tokens": asked_output(body) or DEFAULT_MAX_TOKENS,
    }
    if schema := format_instruction(body.get("response_format")):
        system.append({"type": "text", "text": schema})
    if any("cache_control" in block for block in system):
        request["system"] = system
    elif system:
        request["system"] = "\n\n".join(block["text"] for block in system)
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            request[name] = body[name]
    if (stop := body.get("stop")) is not None:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("tools"):
        request["tools"] = [_tool(tool) for tool in body["tools"]]
    if (choice := _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))):
        request["tool_choice"] = choice
    if budget := thinking_budget(body):
        request["thinking"] = {"type": "enabled", "budget_tokens": budget}
        request["max_tokens"] = max(request["max_tokens"], budget + THINKING_ROOM)
        request.pop("temperature", None)  # extended thinking requires the default temperature
    if body.get("user"):
        request["metadata"] = {"user_id": str(body["user"])}
    return limit_breakpoints(request)


def limit_breakpoints(request: dict[str, Any]) -> dict[str, Any]:
    """`request` with at most `MAX_BREAKPOINTS` blocks marked `cache_control`: those nearest
    the end (tools, then system, then messages, as Anthropic reads them) are kept, as each
    cached prefix holds everything before it, so a late breakpoint caches the most."""
    system = request.get("system")
    marked = [block for block in (
        *(request.get("tools") or ()), *(system if isinstance(system, list) else ()),
        *(block for message in request["messages"] for block in message["content"]))
        if "cache_control" in block]
    for block in marked[:-MAX_BREAKPOINTS]:
        del block["cache_control"]
    return request


def cache_control(part: Any) -> dict[str, Any] | None:
    """A part's, message's or tool's `cache_control`, if it has one of the right shape."""
    found = part.get("cache_control") if isinstance(part, dict) else None
    return found if isinstance(found, dict) else None


def _marked(block: dict[str, Any], part: Any) -> dict[str, Any]:
    if (found := cache_control(part)) is not None:
        block["cache_control"] = found
    return block


def _mark_last(blocks: list[dict[str, Any]], message: Any) -> list[dict[str, Any]]:
    """A message's `cache_control` goes on its last block, where its prefix ends."""
    if blocks:
        _marked(blocks[-1], message)
    return blocks


def _conversation(chat: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """System text blocks, and the turns as alternating user/assistant content blocks."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for message in chat:
        role = message.get("role")
        if role in ("system", "developer"):
            system += _mark_last(_system_blocks(message.get("content")), message)
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": message.get("tool_call_id", ""),
                     "content": content_text(message.get("content"))}
            for part in message.get("content") if isinstance(message.get("content"), list) \
                    else ():
                _marked(block, part)
            _append(messages, "user", _mark_last([block], message))
        elif role == "assistant":
            blocks = _blocks(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id", ""),
                               "name": function.get("name", ""),
                               "input": _json_or_empty(function.get("arguments"))})
            _append(messages, "assistant", _mark_last(blocks, message))
        else:
            _append(messages, "user", _mark_last(_blocks(message.get("content")), message))
    return system, messages


def _system_blocks(content: Any) -> list[dict[str, Any]]:
    """A system message as text blocks: one, unless its parts mark where a cache ends."""
    if isinstance(content, list) and any(cache_control(part) for part in content):
        return [_marked({"type": "text", "text": str(part["text"])}, part) for part in content
                if isinstance(part, dict) and part.get("type") == "text" and part.get("text")]
    text = content_text(content)
    return [{"type": "text", "text": text}] if text else []


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # The Messages API wants turns to alternate: consecutive same-role turns are merged.
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content:
        if part.get("type") == "text":
            blocks.append(_marked({"type": "text", "text": part.get("text", "")}, part))
        elif part.get("type") == "image_url":
            image = part.get("image_url") or ""
            blocks.append(_marked(image_block(image if isinstance(image, str)
                                              else image.get("url", "")), part))
    return blocks


def _json_or_empty(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    declared = {"name": function.get("name", ""),
                "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        declared["description"] = function["description"]
    return _marked(declared, tool)


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        picked: dict[str, Any] | None = {"type": "auto"} if parallel is False else None
    elif choice == "required":
        picked = {"type": "any"}
    elif choice in ("auto", "none"):
        picked = {"type": choice}
    elif isinstance(choice, dict):
        picked = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    else:
        picked = None
    if picked is not None and parallel is False and picked["type"] != "none":
        picked["disable_parallel_tool_use"] = True
    return picked


def format_instruction(response_format: Any) -> str | None:
    """An instruction asking for the JSON `response_format` wants, for APIs with no JSON mode."""
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_object":
        return "Respond with a single JSON object and nothing else."
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return ("Respond with a single JSON object, and nothing else, that matches this JSON "
                f"schema: {json.dumps(schema)}")
    return None
