"""Anthropic's Messages vocabulary that kinds and the gateway share: stop reasons and finish
reasons both ways, thinking budgets, usage both ways, image blocks (pure).

The `anthropic`, `bedrock` and `google` kinds read their answers with these; the gateway's own
Messages codec (`gateway.core.messages` for requests, `gateway.adapters.messages` for answers)
maps through the same tables inverted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

# Anthropic's stop reasons as OpenAI finish reasons, and back (the first of each wins).
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                "tool_use": "tool_calls", "refusal": "content_filter", "pause_turn": "stop"}
FINISH_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                  "function_call": "tool_use", "content_filter": "refusal"}
# Reasoning effort as a thinking budget (outbound), and a budget as the effort it buys (inbound).
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}
# Tokens of answer `max_tokens` leaves beyond a thinking budget (Anthropic wants it larger).
THINKING_ROOM = 1024


def thinking_budget(body: Mapping[str, Any]) -> int | None:
    """The thinking budget a chat body's reasoning switch asks of a Messages upstream (which
    then gets `max_tokens` of at least the budget and `THINKING_ROOM`: budgets hold that too)."""
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        kwargs = {}
    if kwargs.get("thinking") is False or body.get("enable_thinking") is False:
        return None
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort in THINKING_BUDGETS:
        return THINKING_BUDGETS[effort]
    if kwargs.get("thinking") is True or body.get("enable_thinking") is True:
        return THINKING_BUDGETS["medium"]
    return None


# -- the head: what routing reads, for every provider ------------------------------------------


# -- what the bridge reads, typed as Anthropic types it ----------------------------------------


class ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


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


# -- inbound: a Messages request as a chat completion, and the answer back ----------------------


def stop_reason(choice: Mapping[str, Any], stop_sequences: Sequence[str] | None
                ) -> tuple[str, str | None]:
    """Anthropic's stop reason (and matched stop sequence) for a chat choice. Servers that
    say which stop string matched (vLLM's `stop_reason`) give `stop_sequence`."""
    finish = choice.get("finish_reason") or "stop"
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return FINISH_REASONS.get(finish, "end_turn"), None


