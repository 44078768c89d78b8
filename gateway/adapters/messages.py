"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API, for any alias.

A provider that speaks Messages (the `anthropic` kind) gets the body as it came; any other is
wrapped in `MessagesBridge`, which sends a chat completion (`gateway.core.messages.to_chat`) and
answers in Messages' shape, streams included (`to_message`, `MessageEvents`, here). Errors on
these routes are in Anthropic's shape too (`providers.contract.errors.Dialect`), with the same
statuses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec

from gateway.adapters.seam import RESUMED
from gateway.core import endpoints
from gateway.core.messages import new_id, to_chat
from gateway.core.tokens import estimated_tokens
from providers.contract.errors import ProviderUnavailable
from providers.contract.messages import anthropic_usage, stop_reason
from providers.contract.provider import Adapter, Outgoing, Reply
from providers.contract.stream import close_quietly
from providers.wire import sse

ENDPOINTS = endpoints.ANTHROPIC

class MessagesBridge(Adapter):
    """Wraps a chat provider: Messages requests go out as chat completions, answers come back
    as Messages; its errors pass through unchanged, so failover is decided as for chat."""

    kind = "messages-bridge"
    endpoints = ENDPOINTS

    def _chat(self, request: Outgoing, upstream_model: str) -> Outgoing:
        # Prompt-cache marks go only where they are read: elsewhere they may be refused.
        marks = self.inner.takes_cache_control(upstream_model)
        return request.with_body("chat/completions", to_chat(request.json(), marks))

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint == "messages/count_tokens":
            counted = {"input_tokens": estimated_tokens(request.json())}
            return Reply(msgspec.json.encode(counted))
        answer = await self.inner.send(self._chat(request, upstream_model), upstream_model)
        message = to_message(msgspec.json.decode(answer.body), request.model,
                                      request.json())
        return Reply(msgspec.json.encode(message), usage=answer.usage)

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        chunks = self.inner.stream(self._chat(request, upstream_model), upstream_model)
        events = MessageEvents(request.model, request.json())
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


def _translate(events: MessageEvents, event: sse.Event) -> bytes:
    if event.done:
        return b""
    data = msgspec.json.decode(event.data)
    if "error" in data:  # the chat upstream's own error event
        raise ProviderUnavailable(str((data["error"] or {}).get("message", "upstream error")))
    return events.feed(data)


def _arguments(text: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(text or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def to_message(chat: Mapping[str, Any], model: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages API answer for a chat completion (its first choice)."""
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    said = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reasoning := said.get("reasoning_content") or said.get("reasoning"):
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if said.get("content"):
        content.append({"type": "text", "text": said["content"]})
    for call in said.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or new_id(),
                        "name": function.get("name") or "",
                        "input": _arguments(function.get("arguments"))})
    reason, sequence = stop_reason(choice, request.get("stop_sequences"))
    return {"id": new_id(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": anthropic_usage(chat.get("usage"))}


def event(kind: str, payload: Mapping[str, Any]) -> bytes:
    """One Messages stream event: its name and its JSON."""
    return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(
        {"type": kind, **payload}) + b"\n\n"


class MessageEvents:
    """Chat-completion chunks in (decoded), Messages stream events out: `message_start` and a
    `ping` first, a content block per kind of output (thinking, text, each tool call), and
    `message_delta` + `message_stop` from `finish()`, once the upstream's usage is known."""

    def __init__(self, model: str, request: Mapping[str, Any]) -> None:
        self.model = model
        self.stop_sequences = request.get("stop_sequences")
        self.id = new_id()
        self.started = False
        self.open: tuple[str, int] | None = None  # the open block: its kind and index
        self.blocks = 0
        self.calls: dict[int, int] = {}  # a chat tool call's index → its block's index
        self.finish_choice: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        out = []
        if not self.started:
            self.started = True
            out.append(event("message_start", {"message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}))
            out.append(event("ping", {}))
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # Messages answers have one choice
            delta = choice.get("delta") or {}
            if reasoning := delta.get("reasoning_content") or delta.get("reasoning"):
                out.append(self._into("thinking", {"type": "thinking", "thinking": "",
                                                    "signature": ""}))
                out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
            if delta.get("content"):
                out.append(self._into("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or ():
                out.append(self._tool(call))
            if choice.get("finish_reason"):
                self.finish_choice = dict(choice)
        return b"".join(out)

    @property
    def finished(self) -> bool:
        return self.finish_choice is not None

    def finish(self) -> bytes:
        """The closing events; call once the upstream is done and `finished` is true."""
        out = [self._close()]
        reason, sequence = stop_reason(self.finish_choice or {}, self.stop_sequences)
        usage = anthropic_usage(self.usage)
        out.append(event("message_delta", {"delta": {"stop_reason": reason,
                                                     "stop_sequence": sequence},
                                           "usage": usage}))
        out.append(event("message_stop", {}))
        return b"".join(out)

    def _into(self, kind: str, block: dict[str, Any]) -> bytes:
        if self.open is not None and self.open[0] == kind:
            return b""
        closed = self._close()
        self.open = (kind, self.blocks)
        self.blocks += 1
        return closed + event("content_block_start", {"index": self.open[1],
                                                      "content_block": block})

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        at = index if index is not None else (self.open[1] if self.open else 0)
        return event("content_block_delta", {"index": at, "delta": delta})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        closed, self.open = self.open[1], None
        return event("content_block_stop", {"index": closed})

    def _tool(self, call: Mapping[str, Any]) -> bytes:
        number = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        if number not in self.calls:
            out = self._into(f"tool_use:{number}", {
                "type": "tool_use", "id": call.get("id") or new_id(),
                "name": function.get("name") or "", "input": {}})
            self.calls[number] = self.blocks - 1
        if arguments := function.get("arguments"):
            out += self._delta({"type": "input_json_delta", "partial_json": arguments},
                               self.calls[number])
        return out
