"""Bedrock's Converse API and OpenAI chat completions, translated both ways (pure).

`to_converse` builds a Converse (or ConverseStream) body; `to_chat_completion` reads its answer
(its stream is `bedrock_stream`'s). Approximated: images must be data URIs (Converse fetches no
URL), `tool_choice: "none"` sends the tools with no choice (Converse has no "none"),
`response_format` becomes an instruction in the system prompt, `n`, `seed`, penalties and
`logprobs` are dropped. A `cache_control` (on a part, a message or a tool, as the `anthropic`
kind reads it) becomes a `cachePoint` after its block, for models that take them
(`cache_points`); its `ttl` is not sent, and past `MAX_BREAKPOINTS` the earliest are dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from providers.contract.chat import ChatRequest, asked_output, checked, content_text
from providers.contract.errors import BadUpstreamResponse, InvalidRequest
from providers.contract.messages import usage_of
from providers.kinds.anthropic_request import MAX_BREAKPOINTS, cache_control, format_instruction

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                "tool_use": "tool_calls", "guardrail_intervened": "content_filter",
                "content_filtered": "content_filter",
                "model_context_window_exceeded": "length"}
IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg",
                 "image/gif": "gif", "image/webp": "webp"}
CACHE_POINT = {"cachePoint": {"type": "default"}}


# -- the request ---------------------------------------------------------------------------------


def to_converse(body: Mapping[str, Any], cache_points: bool = False) -> dict[str, Any]:
    """The Converse body for an OpenAI chat-completions body (the model goes in the URL);
    InvalidRequest names a field of the wrong type or an image Converse cannot take. With
    `cache_points`, prompt-cache marks become `cachePoint` blocks."""
    checked(body, ChatRequest)  # what follows reads only fields of the types checked here
    system, messages = conversation(body.get("messages") or ())
    request: dict[str, Any] = {"messages": messages}
    if instruction := format_instruction(body.get("response_format")):
        system.append({"text": instruction})
    if system:
        request["system"] = system
    if config := inference_config(body):
        request["inferenceConfig"] = config
    if tools := tool_config(body.get("tools"), body.get("tool_choice")):
        request["toolConfig"] = tools
    return limit_cache_points(request) if cache_points else without_cache_points(request)


def _places(request: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The lists a `cachePoint` may stand in, in the order Bedrock reads them."""
    return [(request.get("toolConfig") or {}).get("tools") or [], request.get("system") or [],
            *(message["content"] for message in request["messages"])]


def limit_cache_points(request: dict[str, Any]) -> dict[str, Any]:
    """At most `MAX_BREAKPOINTS` cache points, those nearest the end kept (as `anthropic`
    keeps its breakpoints)."""
    points = sum(block == CACHE_POINT for blocks in _places(request) for block in blocks)
    extra = max(0, points - MAX_BREAKPOINTS)
    for blocks in _places(request):
        while extra and CACHE_POINT in blocks:
            blocks.remove(CACHE_POINT)
            extra -= 1
    return request


def without_cache_points(request: dict[str, Any]) -> dict[str, Any]:
    """No cache point: the model would refuse them."""
    for blocks in _places(request):
        blocks[:] = [block for block in blocks if block != CACHE_POINT]
    return request


def _cached(blocks: list[dict[str, Any]], mark: Any) -> list[dict[str, Any]]:
    """`blocks` with a cache point after them if `mark` (a part, a message) carries one."""
    if blocks and cache_control(mark) is not None and blocks[-1] != CACHE_POINT:
        blocks.append(dict(CACHE_POINT))
    return blocks


def conversation(chat: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """System blocks, and the turns as alternating user/assistant content blocks, with cache
    points where the chat marks a cache's end."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for message in chat:
        role = message.get("role")
        if role in ("system", "developer"):
            system += _cached(_system_blocks(message.get("content")), message)
        elif role == "tool":
            text = content_text(message.get("content"))  # a blank text block is refused
            result = {"toolUseId": message.get("tool_call_id", ""),
                      "content": [{"text": text}] if text else []}
            parts = message.get("content") if isinstance(message.get("content"), list) else []
            marked = next((part for part in parts if cache_control(part)), message)
            _append(messages, "user", _cached([{"toolResult": result}], marked))
        elif role == "assistant":
            blocks = _blocks(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"toolUse": {"toolUseId": call.get("id", ""),
                                           "name": function.get("name", ""),
                                           "input": _json_object(function.get("arguments"))}})
            _append(messages, "assistant", _cached(blocks, message))
        else:
            _append(messages, "user", _cached(_blocks(message.get("content")), message))
    return system, messages


def _system_blocks(content: Any) -> list[dict[str, Any]]:
    """A system message as text (a system prompt takes no image): one block, or one per run
    of parts ending at a part that marks a cache's end, each followed by its cache point."""
    if not isinstance(content, list):
        return [{"text": text}] if (text := content_text(content)) else []
    blocks: list[dict[str, Any]] = []
    pending = ""
    for part in content:
        pending += str(part.get("text", "")) if isinstance(part, dict) else ""
        if pending and cache_control(part) is not None:
            blocks += [{"text": pending}, dict(CACHE_POINT)]
            pending = ""
    return [*blocks, {"text": pending}] if pending else blocks


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # Converse refuses a turn without content and wants user and assistant turns to alternate.
    if not blocks:
        return
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if part.get("type") == "text" and part.get("text"):
            blocks.append({"text": str(part["text"])})
        elif part.get("type") == "image_url":
            image = part.get("image_url") or ""
            blocks.append(image_block(image if isinstance(image, str) else
                                      str(image.get("url", ""))))
        else:
            continue
        _cached(blocks, part)  # after the part's own block
    return blocks


def image_block(url: str) -> dict[str, Any]:
    """An `image` block with its bytes (base64 in JSON) for a data URI."""
    media_type, _, data = url[5:].partition(";base64,") if url.startswith("data:") \
        else ("", "", "")
    image_format = IMAGE_FORMATS.get(media_type.lower())
    if not data or image_format is None:
        raise InvalidRequest("Bedrock takes images as base64 data URIs of PNG, JPEG, GIF or "
                             "WebP only", param="messages")
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error:
        raise InvalidRequest("An image's data URI is not base64", param="messages") from None
    return {"image": {"format": image_format, "source": {"bytes": data}}}


def _json_object(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def inference_config(body: Mapping[str, Any]) -> dict[str, Any]:
    """`inferenceConfig`: the answer's length, sampling and stop sequences."""
    config: dict[str, Any] = {}
    if limit := asked_output(body):
        config["maxTokens"] = limit
    if body.get("temperature") is not None:
        config["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        config["topP"] = body["top_p"]
    if stop := body.get("stop"):
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    return config


def tool_config(tools: Any, choice: Any) -> dict[str, Any] | None:
    """`toolConfig`: the functions as tool specs and the client's choice among them."""
    specs: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        function = tool.get("function") or {}
        spec: dict[str, Any] = {"name": function.get("name", ""), "inputSchema": {
            "json": function.get("parameters") or {"type": "object", "properties": {}}}}
        if function.get("description"):
            spec["description"] = function["description"]
        specs.append({"toolSpec": spec})
        _cached(specs, tool)
    if not specs:
        return None
    config: dict[str, Any] = {"tools": specs}
    if choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and (name := (choice.get("function") or {}).get("name")):
        config["toolChoice"] = {"tool": {"name": name}}
    return config


# -- the answer ----------------------------------------------------------------------------------


def converse_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Converse's usage in OpenAI's names: cache reads and writes are prompt tokens, reads
    counted as cached (as Anthropic's are)."""
    found = usage or {}
    return usage_of({"input_tokens": found.get("inputTokens"),
                     "output_tokens": found.get("outputTokens"),
                     "cache_read_input_tokens": found.get("cacheReadInputTokens"),
                     "cache_creation_input_tokens": found.get("cacheWriteInputTokens")})


def finish_reason(stop_reason: str | None) -> str:
    """OpenAI's finish reason for a Converse stop reason."""
    return STOP_REASONS.get(stop_reason or "", "stop")


def to_chat_completion(answer: Mapping[str, Any], model: str,
                       request_id: str | None = None) -> dict[str, Any]:
    """An OpenAI chat completion for a Converse answer."""
    message = (answer.get("output") or {}).get("message")
    if not isinstance(message, dict):
        raise BadUpstreamResponse("Converse answer has no output message")
    text, reasoning, calls = [], [], []
    for block in message.get("content") or ():
        if "text" in block:
            text.append(str(block["text"]))
        elif isinstance(use := block.get("toolUse"), dict):
            calls.append({"id": use.get("toolUseId", ""), "type": "function",
                          "function": {"name": use.get("name", ""),
                                       "arguments": json.dumps(use.get("input") or {})}})
        elif isinstance(thought := block.get("reasoningContent"), dict):
            reasoning.append(str((thought.get("reasoningText") or {}).get("text", "")))
    said: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None,
                            "refusal": None}
    if reasoning:
        said["reasoning"] = said["reasoning_content"] = "".join(reasoning)
    if calls:
        said["tool_calls"] = calls
    return {"id": f"chatcmpl-{request_id or uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": said, "logprobs": None,
                         "finish_reason": finish_reason(answer.get("stopReason"))}],
            "usage": converse_usage(answer.get("usage"))}
