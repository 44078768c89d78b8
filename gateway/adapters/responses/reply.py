"""A chat completion as a Responses API `Response` object (pure)."""

from __future__ import annotations

import os
import time
from typing import Any

from gateway.adapters.responses.request import input_messages


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: a prefix and random hex."""
    return f"{prefix}_{os.urandom(12).hex()}"


def skeleton(request: dict[str, Any], response_id: str, status: str) -> dict[str, Any]:
    """The fields every Response carries, echoing what the request asked for."""
    text_format = (request.get("text") or {}).get("format") or {"type": "text"}
    return {
        "id": response_id, "object": "response", "created_at": int(time.time()),
        "status": status, "model": request.get("model"), "output": [],
        "instructions": request.get("instructions"), "metadata": request.get("metadata") or {},
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature"), "top_p": request.get("top_p"),
        "max_output_tokens": request.get("max_output_tokens"),
        "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools") or [],
        "text": {"format": text_format}, "reasoning": request.get("reasoning"),
        "previous_response_id": request.get("previous_response_id"),
        "store": request.get("store", True), "error": None, "incomplete_details": None,
    }


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat usage in the Responses names."""
    if not chat_usage:
        return None
    completion = chat_usage.get("completion_tokens_details") or {}
    prompt = chat_usage.get("prompt_tokens_details") or {}
    return {"input_tokens": chat_usage.get("prompt_tokens", 0),
            "input_tokens_details": {"cached_tokens": prompt.get("cached_tokens") or 0,
                                     "cache_write_tokens": 0},
            "output_tokens": chat_usage.get("completion_tokens", 0),
            "output_tokens_details": {"reasoning_tokens":
                                      completion.get("reasoning_tokens") or 0},
            "total_tokens": chat_usage.get("total_tokens", 0)}


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id or new_id("rs"), "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def message_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id or new_id("msg"), "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}]}


def call_item(call_id: str, name: str, arguments: str, item_id: str | None = None
              ) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call_id,
            "name": name, "arguments": arguments, "status": "completed"}


def finish(response: dict[str, Any], finish_reason: str | None) -> None:
    """Set `status` (and why it is incomplete) from the chat finish reason."""
    if finish_reason == "length":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    elif finish_reason == "content_filter":
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "content_filter"}
    else:
        response["status"] = "completed"


def to_response(chat: dict[str, Any], request: dict[str, Any],
                response_id: str) -> dict[str, Any]:
    """The Response for a non-streamed chat completion."""
    response = skeleton(request, response_id, "completed")
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        response["output"].append(reasoning_item(reasoning))
    if message.get("content"):
        response["output"].append(message_item(message["content"]))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        response["output"].append(call_item(call.get("id") or new_id("call"),
                                            function.get("name", ""),
                                            function.get("arguments", "")))
    finish(response, choice.get("finish_reason"))
    if (counted := usage(chat.get("usage"))) is not None:
        response["usage"] = counted
    return response


def output_as_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as chat messages, so a later turn can continue from it."""
    items = [item for item in output if item.get("type") in ("message", "function_call")]
    return input_messages([{**item, "role": item.get("role", "assistant")} for item in items])
