"""ConverseStream's answer in OpenAI's chunks, and the AWS event-stream framing under it (pure).

`EventReader` is the event-stream framing itself (botocore's parser), shared with the Anthropic
Messages streams Bedrock wraps in the same framing; `StreamTranslator` turns ConverseStream's
messages into chat-completion chunks. An exception message in the stream raises the error it
stands for: a failover before the first token, an in-band error after it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
from botocore.eventstream import EventStreamBuffer, ParserError

from providers.contract.errors import (
    BadUpstreamResponse,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
)
from providers.kinds.bedrock_converse import converse_usage, finish_reason
from providers.wire import sse
from providers.wire.upstream_errors import scrub

# Exceptions a stream may carry instead of its next event; a throttle is a rate limit, every
# other one (modelStreamErrorException, internalServerException, …) the provider's failure.
RATE_LIMITED = frozenset({"throttlingException", "ThrottlingException"})


def stream_error(kind: str, payload: bytes) -> ProviderError:
    """The error an event-stream exception message stands for: a failover before the first
    token, an in-band error after it."""
    try:
        said = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        said = {}
    message = said.get("message") if isinstance(said, dict) else None
    text = scrub(f"{kind}: {message or payload[:200].decode('utf-8', 'replace')}")
    if kind in RATE_LIMITED:
        return ProviderRateLimited(text)
    return ProviderUnavailable(text)


class EventReader:
    """AWS event-stream bytes in, `(event type, payload)` out; an exception message raises,
    once the events that came before it in the same read have been handed out."""

    def __init__(self) -> None:
        self._buffer = EventStreamBuffer()
        self._failed: ProviderError | None = None

    def feed(self, chunk: bytes) -> list[tuple[str, bytes]]:
        """The events whole in what has come so far."""
        self.close()
        self._buffer.add_data(chunk)
        events: list[tuple[str, bytes]] = []
        try:
            for message in self._buffer:
                headers = message.headers
                kind = headers.get(":message-type")
                if kind == "event":
                    events.append((str(headers.get(":event-type", "")), message.payload))
                    continue
                if kind == "exception":
                    self._failed = stream_error(str(headers.get(":exception-type", "exception")),
                                                message.payload)
                else:  # "error": its code and message in headers
                    self._failed = stream_error(str(headers.get(":error-code", "error")),
                                                msgspec.json.encode(
                                                    {"message": headers.get(":error-message")}))
                break
        except ParserError as exc:
            self._failed = BadUpstreamResponse(f"stream is not AWS event-stream framing: {exc}")
        if not events:
            self.close()
        return events

    def close(self) -> None:
        """Raise the exception the stream carried, if it carried one."""
        if (failed := self._failed) is not None:
            self._failed = None
            raise failed


class StreamTranslator:
    """ConverseStream's event-stream in, OpenAI chat-completion chunks (SSE bytes) out."""

    def __init__(self, model: str, request_id: str | None = None) -> None:
        self.model = model
        self.id = f"chatcmpl-{request_id or uuid.uuid4().hex}"
        self.created = int(time.time())
        self.calls: dict[int, int] = {}  # content block index → tool call index
        self.stopped = False
        self.ended = False
        self.usage: dict[str, Any] = {}
        self._role = False  # the message started and its role is still to be sent
        self._reader = EventReader()

    def feed(self, chunk: bytes) -> bytes:
        """Chunks for every event whole in `chunk`; an exception message raises."""
        return b"".join(self._event(kind, payload) for kind, payload in self._reader.feed(chunk))

    def close(self) -> bytes:
        """At the upstream's end: the exception it carried raised; else usage and `[DONE]` if
        the message stopped and no metadata event came to say so; nothing for a stream cut
        short."""
        self._reader.close()
        return self._end() if self.stopped and not self.ended else b""

    def _event(self, kind: str, payload: bytes) -> bytes:
        event = msgspec.json.decode(payload) if payload else {}
        if not isinstance(event, dict):
            raise BadUpstreamResponse(f"{kind} event is not a JSON object")
        if kind == "messageStart":
            # The role goes with the first content: an exception between the two is still a
            # failover, as nothing was said yet.
            self._role = True
            return b""
        if kind == "contentBlockStart":
            use = (event.get("start") or {}).get("toolUse")
            return self._tool_start(event.get("contentBlockIndex", 0), use) \
                if isinstance(use, dict) else b""
        if kind == "contentBlockDelta":
            return self._delta(event.get("contentBlockIndex", 0), event.get("delta") or {})
        if kind == "messageStop":
            self.stopped = True
            return self._chunk({}, finish_reason(event.get("stopReason")))
        if kind == "metadata":
            self.usage = event.get("usage") or self.usage
            return self._end() if self.stopped else b""
        return b""  # contentBlockStop, and events added later

    def _tool_start(self, index: int, use: Mapping[str, Any]) -> bytes:
        call = self.calls[index] = len(self.calls)
        return self._chunk({"tool_calls": [{
            "index": call, "id": use.get("toolUseId", ""), "type": "function",
            "function": {"name": use.get("name", ""), "arguments": ""}}]})

    def _delta(self, index: int, delta: Mapping[str, Any]) -> bytes:
        if "text" in delta:
            return self._chunk({"content": str(delta["text"])})
        if isinstance(use := delta.get("toolUse"), dict):
            return self._chunk({"tool_calls": [{"index": self.calls.get(index, 0), "function": {
                "arguments": str(use.get("input", ""))}}]})
        if isinstance(thought := delta.get("reasoningContent"), dict) and "text" in thought:
            text = str(thought["text"])
            return self._chunk({"reasoning": text, "reasoning_content": text})
        return b""  # a reasoning signature, redacted reasoning

    def _end(self) -> bytes:
        self.ended = True
        usage = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.model, "choices": [], "usage": converse_usage(self.usage)}
        return sse.encode(msgspec.json.encode(usage)) + sse.encode(sse.DONE)

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if self._role:
            self._role = False
            delta = {"role": "assistant", **delta}
        return sse.encode(msgspec.json.encode({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}]}))
