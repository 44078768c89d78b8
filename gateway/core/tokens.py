"""The estimate of a prompt's tokens from its content, for a provider that cannot count them
(`count_tokens`) and for routing by context window (`gateway.routing.sizing`). A budget's worst
case takes a token per four bytes of the whole body instead (`gateway.accounts.pricing`): never
less than this, with no second parse."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gateway.core.messages import to_chat

# Per message and per tool, what a chat template adds around the text, in tokens (estimates).
MESSAGE_OVERHEAD = 4
TOOL_OVERHEAD = 8


def estimated_tokens(body: dict[str, Any]) -> int:
    """`count_tokens` for a provider that cannot count: about four characters a token of the
    text, tool definitions and tool calls, plus a few per message (docs/api.md says so)."""
    return chat_tokens(to_chat(body))


def chat_tokens(chat: Mapping[str, Any]) -> int:
    """The same estimate for a chat completion's body (what routing checks against a model's
    context window, `gateway.routing.sizing`)."""
    text = "".join(msgspec.json.encode(m.get("content") or "").decode()
                   + msgspec.json.encode(m.get("tool_calls") or "").decode()
                   for m in chat["messages"])
    tools = msgspec.json.encode(chat.get("tools") or []).decode()
    return ((len(text) + len(tools)) + 3) // 4 + MESSAGE_OVERHEAD * len(chat["messages"]) \
        + TOOL_OVERHEAD * len(chat.get("tools") or ())
