"""The gateway's one estimate of a prompt's tokens, for a provider that cannot count them
(`count_tokens`), for routing by context window (`gateway.routing.sizing`) and for a budget's
worst case (`gateway.accounts.pricing`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from providers.contract import messages

# Per message and per tool, what a chat template adds around the text, in tokens (estimates).
MESSAGE_OVERHEAD = 4
TOOL_OVERHEAD = 8


def estimated_tokens(body: dict[str, Any]) -> int:
    """`count_tokens` for a provider that cannot count: about four characters a token of the
    text, tool definitions and tool calls, plus a few per message (docs/api.md says so)."""
    return chat_tokens(messages.to_chat(body))


def chat_tokens(chat: Mapping[str, Any]) -> int:
    """The same estimate for a chat completion's body (what routing checks against a model's
    context window, `gateway.routing.sizing`)."""
    text = "".join(msgspec.json.encode(m.get("content") or "").decode()
                   + msgspec.json.encode(m.get("tool_calls") or "").decode()
                   for m in chat["messages"])
    tools = msgspec.json.encode(chat.get("tools") or []).decode()
    return ((len(text) + len(tools)) + 3) // 4 + MESSAGE_OVERHEAD * len(chat["messages"]) \
        + TOOL_OVERHEAD * len(chat.get("tools") or ())
