"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API, for any alias.

A provider that speaks Messages (the `anthropic` kind) gets the body as it came; any other is
wrapped in `MessagesBridge`, which sends a chat completion (`providers.contract.messages`
translates both ways) and answers in Messages' shape, streams included. Errors on these routes
are in Anthropic's shape too (`error_body`, `error_event`), with the same statuses as elsewhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from providers.contract import messages
from providers.contract.errors import GatewayError, ProviderUnavailable
from providers.contract.provider import Outgoing, Provider, Reply

ENDPOINTS = frozenset({"messages", "messages/count_tokens"})
# Anthropic's error types by status; anything else is an `api_error`.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}
# Per message and per tool, what a chat template adds around the text, in tokens (estimates).
MESSAGE_OVERHEAD = 4
TOOL_OVERHEAD = 8


def error_body(error: GatewayError) -> bytes:
    """The error in Anthropic's envelope: `{"type": "error", "error": {type, message}}`; the
    field at fault starts the message, as Anthropic writes it."""
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return msgspec.json.encode({"type": "error", "error": {
        "type": ERROR_TYPES.get(error.status, "api_error"), "message": message}})


def error_event(error: GatewayError) -> bytes:
    """A mid-stream failure as Anthropic's `error` event."""
    return b"event: error\ndata: " + error_body(error) + b"\n\n"


def estimated_tokens(body: dict[str, Any]) -> int:
    """`count_tokens` for a provider that cannot count: about four characters a token of the
    text, tool definitions and tool calls, plus a few per message (docs/api.md says so)."""
    chat = messages.to_chat(body)
    text = "".join(msgspec.json.encode(m.get("content") or "").decode()
                   + msgspec.json.encode(m.get("tool_calls") or "").decode()
                   for m in chat["messages"])
    tools = msgspec.json.encode(chat.get("tools") or []).decode()
    return ((len(text) + len(tools)) + 3) // 4 + MESSAGE_OVERHEAD * len(chat["messages"]) \
        + TOOL_OVERHEAD * len(chat.get("tools") or ())


class MessagesBridge(Provider):
    """Wraps a chat provider: Messages requests go out as chat completions, answers come back
    as Messages; its errors pass through unchanged, so failover is decided as for chat."""

    kind = "messages-bridge"
    endpoints = ENDPOINTS

    def __init__(self, inner: Provider) -> None:
        super().__init__(inner.spec, inner.transport)
        self.inner = inner

    @staticmethod
    def _chat(request: Outgoing) -> Outgoing:
        chat = messages.to_chat(request.json())
        return Outgoing("chat/completions", msgspec.json.encode(chat), request.model,
                        request.stream, request.request_id, client_wants_usage=True,
                        key_id=request.key_id)

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint == "messages/count_tokens":
            counted = {"input_tokens": estimated_tokens(request.json())}
            return Reply(msgspec.json.encode(counted))
        answer = await self.inner.send(self._chat(request), upstream_model)
        message = messages.to_message(msgspec.json.decode(answer.body), request.model,
                                      request.json())
        return Reply(msgspec.json.encode(message), usage=answer.usage)

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        chunks = self.inner.stream(self._chat(request), upstream_model)
        events = messages.MessageEvents(request.model, request.json())
        buffer = b""
        try:
            async for chunk in chunks:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n\n")
                if out := b"".join(_translate(events, raw) for raw in complete):
                    yield out
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        if not events.finished:
            raise ProviderUnavailable("stream ended before it finished")
        yield events.finish()


def _translate(events: messages.MessageEvents, raw: bytes) -> bytes:
    line = raw.strip()
    if not line.startswith(b"data:"):
        return b""
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return b""
    data = msgspec.json.decode(payload)
    if "error" in data:  # the chat upstream's own error event
        raise ProviderUnavailable(str((data["error"] or {}).get("message", "upstream error")))
    return events.feed(data)
