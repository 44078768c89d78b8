"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API, for any alias.

A provider that speaks Messages (the `anthropic` kind) gets the body as it came; any other is
wrapped in `MessagesBridge`, which sends a chat completion (`providers.contract.messages`
translates both ways) and answers in Messages' shape, streams included. Errors on these routes
are in Anthropic's shape too (`providers.contract.errors.Dialect`), with the same statuses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from gateway.adapters.seam import RESUMED
from gateway.core.tokens import estimated_tokens
from providers.contract import messages
from providers.contract.errors import ProviderUnavailable
from providers.contract.provider import Adapter, Outgoing, Reply
from providers.contract.stream import close_quietly
from providers.wire import sse

ENDPOINTS = frozenset({"messages", "messages/count_tokens"})

class MessagesBridge(Adapter):
    """Wraps a chat provider: Messages requests go out as chat completions, answers come back
    as Messages; its errors pass through unchanged, so failover is decided as for chat."""

    kind = "messages-bridge"
    endpoints = ENDPOINTS

    def _chat(self, request: Outgoing, upstream_model: str) -> Outgoing:
        # Prompt-cache marks go only where they are read: elsewhere they may be refused.
        marks = self.inner.takes_cache_control(upstream_model)
        return request.with_body("chat/completions", messages.to_chat(request.json(), marks))

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint == "messages/count_tokens":
            counted = {"input_tokens": estimated_tokens(request.json())}
            return Reply(msgspec.json.encode(counted))
        answer = await self.inner.send(self._chat(request, upstream_model), upstream_model)
        message = messages.to_message(msgspec.json.decode(answer.body), request.model,
                                      request.json())
        return Reply(msgspec.json.encode(message), usage=answer.usage)

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        chunks = self.inner.stream(self._chat(request, upstream_model), upstream_model)
        events = messages.MessageEvents(request.model, request.json())
        reader = sse.Reader()
        try:
            async for chunk in chunks:
                if out := b"".join(_translate(events, event) for event in reader.feed(chunk)):
                    yield out
        finally:
            await close_quietly(chunks)
        if not events.finished:
            raise ProviderUnavailable("stream ended before it finished")
        # A chat stream resumed below (`gateway.adapters.resume`) says so before the end.
        yield (RESUMED if request.resumes.ok else b"") + events.finish()


def _translate(events: messages.MessageEvents, event: sse.Event) -> bytes:
    if event.done:
        return b""
    data = msgspec.json.decode(event.data)
    if "error" in data:  # the chat upstream's own error event
        raise ProviderUnavailable(str((data["error"] or {}).get("message", "upstream error")))
    return events.feed(data)
