"""Gemini's answers in OpenAI's shapes: a whole one (`to_chat_completion`) and a stream.

`StreamTranslator` turns `streamGenerateContent?alt=sse` events (each a partial
`GenerateContentResponse`, framed with CRLF) into `chat.completion.chunk` events. Gemini ends a
stream by closing it, not with a sentinel: `close()` adds the usage chunk and `[DONE]` only when
every choice reported a finish reason, so a stream cut short is never passed off as complete.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from providers.contract.errors import BadUpstreamResponse, ProviderUnavailable
from providers.contract.stream import event_object
from providers.wire import sse
from providers.wire.upstream_errors import scrub

FINISH_REASONS = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter",
                  "RECITATION": "content_filter", "BLOCKLIST": "content_filter",
                  "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
                  "IMAGE_SAFETY": "content_filter"}
SIGNATURE_KEY = "thought_signature"  # where Google's own OpenAI endpoint carries it, too


def finish_reason(reason: str | None, called: bool) -> str:
    """OpenAI's finish reason for Gemini's; a turn that called functions ends in `tool_calls`."""
    mapped = FINISH_REASONS.get(reason or "", "stop")
    return "tool_calls" if called and mapped == "stop" else mapped


def tool_call_of(part: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call for a `functionCall` part; Gemini gives no id, so one is made up."""
    call = part.get("functionCall") or {}
    made: dict[str, Any] = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                            "function": {"name": call.get("name", ""),
                                         "arguments": json.dumps(call.get("args") or {})}}
    # Gemini 3 refuses a later turn whose function call lacks the signature it was given.
    if signature := part.get("thoughtSignature"):
        made["extra_content"] = {"google": {SIGNATURE_KEY: signature}}
    return made


def split_parts(parts: Iterable[Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """A candidate's parts as (answer text, thought text, tool calls)."""
    text, thoughts, calls = [], [], []
    for part in parts:
        if not isinstance(part, dict):
            continue
        if "functionCall" in part:
            calls.append(tool_call_of(part))
        elif part.get("thought"):
            thoughts.append(str(part.get("text", "")))
        elif "text" in part:
            text.append(str(part["text"]))
    return "".join(text), "".join(thoughts), calls


def parts_of(candidate: Mapping[str, Any]) -> list[Any]:
    """The parts of a candidate's content (none for a candidate stopped by a filter)."""
    content = candidate.get("content")
    return list(content.get("parts") or ()) if isinstance(content, dict) else []


def usage_of(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Gemini's `usageMetadata` in OpenAI's names; thoughts count as completion tokens."""
    found = metadata or {}
    prompt = (found.get("promptTokenCount") or 0) + (found.get("toolUsePromptTokenCount") or 0)
    thoughts = found.get("thoughtsTokenCount") or 0
    completion = (found.get("candidatesTokenCount") or 0) + thoughts
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": found.get("totalTokenCount") or prompt + completion,
            "prompt_tokens_details": {"cached_tokens": found.get("cachedContentTokenCount") or 0},
            "completion_tokens_details": {"reasoning_tokens": thoughts}}


def blocked_reason(answer: Mapping[str, Any]) -> str | None:
    """Why Gemini refused the prompt itself (no candidates at all), if it did."""
    feedback = answer.get("promptFeedback")
    return feedback.get("blockReason") if isinstance(feedback, dict) else None


def completion_id(answer: Mapping[str, Any]) -> str:
    """A chat completion id from Gemini's `responseId`, or a fresh one."""
    return f"chatcmpl-{answer.get('responseId') or uuid.uuid4().hex}"


def to_chat_completion(answer: Mapping[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat completion for a `generateContent` answer."""
    candidates = [c for c in answer.get("candidates") or () if isinstance(c, dict)]
    if candidates:
        choices = [_choice(candidate, position) for position, candidate in enumerate(candidates)]
    elif blocked_reason(answer):
        choices = [{"index": 0, "message": {"role": "assistant", "content": "", "refusal": None},
                    "logprobs": None, "finish_reason": "content_filter"}]
    else:
        raise BadUpstreamResponse("answer has neither candidates nor a block reason")
    return {"id": completion_id(answer), "object": "chat.completion",
            "created": int(time.time()), "model": answer.get("modelVersion") or model,
            "choices": choices, "usage": usage_of(answer.get("usageMetadata"))}


def _choice(candidate: Mapping[str, Any], position: int) -> dict[str, Any]:
    text, thoughts, calls = split_parts(parts_of(candidate))
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else ""),
                               "refusal": None}
    if thoughts:
        message["reasoning"] = message["reasoning_content"] = thoughts
    if calls:
        message["tool_calls"] = calls
    return {"index": candidate.get("index", position), "message": message, "logprobs": None,
            "finish_reason": finish_reason(candidate.get("finishReason"), bool(calls))}


class StreamTranslator:
    """Gemini SSE events in, OpenAI chat-completion chunks (SSE bytes) out."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id: str | None = None
        self.created = int(time.time())
        self.started: set[int] = set()  # choices that sent their role chunk
        self.finished: set[int] = set()
        self.calls: dict[int, int] = {}  # choice → tool calls streamed so far
        self.usage: dict[str, Any] = {}
        self._reader = sse.Reader()

    def feed(self, chunk: bytes) -> bytes:
        """Chunks for every complete event in `chunk`; raises on an error event."""
        return b"".join(self._event(event.data) for event in self._reader.feed(chunk))

    def close(self) -> bytes:
        """At the upstream's clean end: the usage chunk and `[DONE]` if every choice finished."""
        out = b"".join(self._event(event.data) for event in self._reader.flush())
        if not self.started or self.started - self.finished:
            return out  # the relay reports a stream that ended before it finished
        usage: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk",
                                 "created": self.created, "model": self.model, "choices": [],
                                 "usage": usage_of(self.usage)}
        return out + sse.encode(msgspec.json.encode(usage)) + sse.encode(sse.DONE)

    def _event(self, data: bytes) -> bytes:
        if (payload := event_object(data)) is None:
            return b""
        if isinstance(error := payload.get("error"), dict):
            said = f"{error.get('status', 'error')}: {error.get('message')}"
            raise ProviderUnavailable(scrub(said))  # it may echo the request's headers
        self.id = self.id or completion_id(payload)
        self.model = payload.get("modelVersion") or self.model
        self.usage = payload.get("usageMetadata") or self.usage
        candidates = payload.get("candidates") or []
        if not candidates and blocked_reason(payload):
            return self._start(0) + self._finish(0, "content_filter")
        return b"".join(self._candidate(candidate, position)
                        for position, candidate in enumerate(candidates)
                        if isinstance(candidate, dict))

    def _candidate(self, candidate: Mapping[str, Any], position: int) -> bytes:
        index = candidate.get("index", position)
        out = self._start(index)
        text, thoughts, calls = split_parts(parts_of(candidate))
        if thoughts:
            out += self._chunk(index, {"reasoning": thoughts, "reasoning_content": thoughts})
        if text:
            out += self._chunk(index, {"content": text})
        if calls:
            first = self.calls.get(index, 0)
            self.calls[index] = first + len(calls)
            out += self._chunk(index, {"tool_calls": [{"index": first + n, **call}
                                                      for n, call in enumerate(calls)]})
        if reason := candidate.get("finishReason"):
            out += self._finish(index, finish_reason(reason, index in self.calls))
        return out

    def _start(self, index: int) -> bytes:
        if index in self.started:
            return b""
        self.started.add(index)
        return self._chunk(index, {"role": "assistant", "content": ""})

    def _finish(self, index: int, reason: str) -> bytes:
        if index in self.finished:
            return b""
        self.finished.add(index)
        return self._chunk(index, {}, reason)

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse.encode(msgspec.json.encode({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}]}))
