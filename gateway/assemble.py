"""A whole answer fetched as a stream: early failover for non-streamed requests.

A whole answer gives no sign of life until it is done, so a hung provider could only be given
up after `total`. Sent upstream as a stream instead, the request gets the stream's watchdogs
(`first_token`, `idle`), and since the client has been sent nothing, a break anywhere before
the end is still a failover. The chunks are assembled (`ChatAssembler`,
`CompletionAssembler`, pure) into the very answer the provider would have given whole: every
choice, content, reasoning, refusal, tool calls, logprobs, `finish_reason`, usage,
`system_fingerprint`. A provider with `"stream_upstream": false` is asked for the whole answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gateway.router import first_token
from gateway.streaming import DONE_EVENT, open_stream, read_to_end
from providers.contract.answer import check_json
from providers.contract.errors import AnsweredWhole, BadUpstreamResponse, ProviderUnavailable
from providers.contract.provider import Outgoing, Provider, Reply
from providers.contract.usage import Usage

ENDPOINTS = frozenset({"chat/completions", "completions"})
# Fields of the first chunk that the whole answer carries as they are.
_TOP = ("id", "created", "model", "system_fingerprint", "service_tier")


def streams_upstream(provider: Provider, request: Outgoing) -> bool:
    """Whether this whole-answer request goes upstream as a stream."""
    return (not request.stream and request.endpoint in ENDPOINTS
            and provider.supports(request.endpoint) and provider.streams_whole_answers())


async def send(provider: Provider, request: Outgoing, upstream_model: str) -> Reply:
    """The whole answer, assembled from the provider's stream."""
    choices = request.json().get("n") or 1
    assembler: ChatAssembler | CompletionAssembler = ChatAssembler() \
        if request.endpoint == "chat/completions" else CompletionAssembler()
    try:
        opened = await open_stream(provider.stream(request.asking(stream=True), upstream_model),
                                   choices)
    except AnsweredWhole as whole:  # the server ignored `stream`: what came is the answer
        return _whole(whole.payload)
    first_token()  # a hedged race is decided here, though the answer is read to its end
    watch = opened.watch
    limit, size = provider.spec.max_answer_bytes, len(opened.head)
    try:
        assembler.feed(opened.head)
        if not watch.done:
            async for chunk in opened.rest:
                size += len(chunk)
                if size > limit:  # held in memory until whole: bounded as whole answers are
                    raise BadUpstreamResponse(f"answer is larger than max_answer_bytes "
                                              f"({limit})")
                watch.feed(chunk)
                if watch.error_event is not None or watch.malformed or watch.garbage:
                    raise ProviderUnavailable("stream broke before it finished")
                assembler.feed(chunk)
                if watch.done:
                    break
        if watch.done:  # read the body's end, so its connection is kept for the next request
            await read_to_end(opened.rest)
    finally:
        aclose = getattr(opened.rest, "aclose", None)
        if aclose is not None:
            await aclose()
    if not (watch.done or watch.finished) or not assembler.choices:
        raise ProviderUnavailable("stream ended before it finished")
    answer = assembler.answer()
    usage = msgspec.convert(answer["usage"], Usage) if answer.get("usage") else None
    return Reply(msgspec.json.encode(answer), usage=usage)


def _whole(payload: bytes) -> Reply:
    """A whole answer that came instead of a stream, if it is one (a failover if not)."""
    return Reply(payload, usage=check_json(payload))


class _Assembler:
    """Events in, one answer out; subclasses say how a choice grows."""

    object_name = ""

    def __init__(self) -> None:
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self._partial = b""

    def feed(self, chunk: bytes) -> None:
        buffer = self._partial + chunk
        *events, self._partial = buffer.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                line = line.strip()
                if line.startswith(b"data:") and line[5:].strip() != DONE_EVENT[5:].strip():
                    self._event(msgspec.json.decode(line[5:]))

    def _event(self, event: Mapping[str, Any]) -> None:
        for name in _TOP:
            if name not in self.top and event.get(name) is not None:
                self.top[name] = event[name]
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            grown = self.choices.setdefault(index, self._new(index))
            self._grow(grown, choice)
            if choice.get("finish_reason") is not None:
                grown["finish_reason"] = choice["finish_reason"]
            for extra in ("stop_reason", "matched_stop"):  # vLLM's and SGLang's
                if extra in choice:
                    grown[extra] = choice[extra]

    def answer(self) -> dict[str, Any]:
        """The whole answer, choices in index order."""
        answer = {"id": self.top.get("id", ""), "object": self.object_name,
                  "created": self.top.get("created", 0), "model": self.top.get("model", ""),
                  "choices": [self._done(self.choices[i]) for i in sorted(self.choices)]}
        for name in ("system_fingerprint", "service_tier"):
            if name in self.top:
                answer[name] = self.top[name]
        answer["usage"] = self.usage
        return answer

    def _new(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def _grow(self, grown: dict[str, Any], choice: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _done(self, grown: dict[str, Any]) -> dict[str, Any]:
        return grown


class ChatAssembler(_Assembler):
    """`chat.completion.chunk` events into a `chat.completion`."""

    object_name = "chat.completion"

    def _new(self, index: int) -> dict[str, Any]:
        return {"index": index, "message": {"role": "assistant", "content": None},
                "logprobs": None, "finish_reason": None}

    def _grow(self, grown: dict[str, Any], choice: Mapping[str, Any]) -> None:
        message = grown["message"]
        delta = choice.get("delta") or {}
        for name, value in delta.items():
            if name == "role":
                message["role"] = value or message["role"]
            elif name == "tool_calls":
                for call in value or ():
                    _grow_call(message.setdefault("tool_calls", []), call)
            elif name == "function_call" and isinstance(value, dict):
                legacy = message.setdefault("function_call", {"name": "", "arguments": ""})
                legacy["name"] += value.get("name") or ""
                legacy["arguments"] += value.get("arguments") or ""
            elif isinstance(value, str):  # content, refusal, reasoning, reasoning_content
                message[name] = (message.get(name) or "") + value
            elif name not in message:
                message[name] = value
        if (logprobs := choice.get("logprobs")) is not None:
            grown["logprobs"] = grown["logprobs"] or {"content": None, "refusal": None}
            for part in ("content", "refusal"):
                if logprobs.get(part) is not None:
                    grown["logprobs"][part] = (grown["logprobs"][part] or []) + logprobs[part]

    def _done(self, grown: dict[str, Any]) -> dict[str, Any]:
        message = grown["message"]
        message.setdefault("refusal", None)
        if message.get("tool_calls") and not message.get("content"):
            message["content"] = None  # as whole answers with tool calls say it
        return grown


def _grow_call(calls: list[dict[str, Any]], delta: Mapping[str, Any]) -> None:
    index = delta.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    for name, value in delta.items():
        if name == "function":
            function = value or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
        elif name != "index" and value:  # id, type, and what a kind adds (extra_content)
            call[name] = value


class CompletionAssembler(_Assembler):
    """Legacy `text_completion` events into one `text_completion`."""

    object_name = "text_completion"

    def _new(self, index: int) -> dict[str, Any]:
        return {"text": "", "index": index, "logprobs": None, "finish_reason": None}

    def _grow(self, grown: dict[str, Any], choice: Mapping[str, Any]) -> None:
        grown["text"] += choice.get("text") or ""
        logprobs = choice.get("logprobs")
        if not logprobs:
            return
        merged = grown["logprobs"] = grown["logprobs"] or {
            "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            merged[name] = merged.get(name, []) + list(logprobs.get(name) or ())
