"""A whole answer fetched as a stream: early failover for non-streamed requests.

A whole answer gives no sign of life until it is done, so a hung provider could only be given
up after `total`. Sent upstream as a stream instead, the request gets the stream's watchdogs
(`first_token`, `idle`), and since the client has been sent nothing, a break anywhere before
the end is still a failover. The events are assembled (`ChatAssembler`, `CompletionAssembler`,
pure, each event decoded once, every piece kept and joined once at the end) into the very
answer the provider would have given whole: every choice, content, reasoning, refusal, tool
calls, logprobs, `finish_reason`, usage, `system_fingerprint`. The answer is bounded in bytes
(`max_answer_bytes`) and in events (`max_answer_events`). A provider with
`"stream_upstream": false` is asked for the whole answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec

from gateway.core import endpoints
from providers.contract.answer import check_json
from providers.contract.errors import AnsweredWhole, BadUpstreamResponse, ProviderUnavailable
from providers.contract.provider import Adapter, Answer, Gathering, Outgoing, Provider, Reply
from providers.contract.stream import (
    UNREADABLE_ANSWER,
    close_quietly,
    open_stream,
    read_to_end,
    unreadable,
)
from providers.contract.usage import Usage
from providers.wire import sse

ENDPOINTS = endpoints.STREAMED_WHOLE
# Fields of the first chunk that the whole answer carries as they are.
_TOP = ("id", "created", "model", "system_fingerprint", "service_tier")
_TEXT_LOGPROBS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class Assembled(Adapter):
    """A provider whose whole answers are asked for as streams and gathered (`Gathering`)."""

    kind = "assembled"

    async def answer(self, request: Outgoing, upstream_model: str) -> Answer:
        if request.stream or request.endpoint not in ENDPOINTS:
            return await self.inner.answer(request, upstream_model)
        assembler = ChatAssembler(request.choices) if request.endpoint == "chat/completions" \
            else CompletionAssembler(request.choices)
        chunks = self.inner.stream(request.asking(stream=True), upstream_model)
        try:
            head, _ = await open_stream(chunks, watch=assembler)
        except AnsweredWhole as whole:  # the server ignored `stream`: what came is the answer
            return Reply(whole.payload, usage=check_json(whole.payload))
        return _Gathering(self.name, assembler, len(head), chunks, self.spec.max_answer_bytes,
                          self.spec.max_answer_events)


def assembles(provider: Provider, endpoint: str) -> bool:
    """Whether whole answers of `endpoint` from `provider` are gathered from streams."""
    return endpoint in ENDPOINTS and provider.supports(endpoint) \
        and provider.streams_whole_answers()


class _Gathering(Gathering):
    def __init__(self, provider: str, assembler: _Assembler, size: int,
                 rest: AsyncIterator[bytes], max_bytes: int, max_events: int) -> None:
        self.provider = provider
        self.assembler = assembler
        self.size = size
        self.rest = rest
        self.max_bytes = max_bytes
        self.max_events = max_events

    async def reply(self) -> Reply:
        try:
            return await self._read()
        except UNREADABLE_ANSWER as exc:
            raise unreadable(self.provider, exc) from None
        finally:
            await close_quietly(self.rest)

    async def _read(self) -> Reply:
        assembler = self.assembler
        if not assembler.done:
            size, max_bytes, max_events = self.size, self.max_bytes, self.max_events
            async for chunk in self.rest:
                size += len(chunk)
                if size > max_bytes:  # held in memory until whole: bounded
                    raise BadUpstreamResponse(f"answer is larger than max_answer_bytes "
                                              f"({max_bytes})")
                if assembler.take(chunk) or assembler.data_events > max_events:
                    if assembler.broken:
                        raise ProviderUnavailable("stream broke before it finished")
                    if assembler.data_events > max_events:
                        raise BadUpstreamResponse(f"answer has more events than "
                                                  f"max_answer_events ({max_events})")
                    break  # done
            else:
                assembler.flush()
            self.size = size
        if assembler.done:  # read the body's end, so its connection is kept for the next request
            await read_to_end(self.rest)
        if assembler.broken or not (assembler.done or assembler.finished) \
                or not assembler.choices:
            raise ProviderUnavailable("stream ended before it finished")
        answer = assembler.answer()
        usage = msgspec.convert(answer["usage"], Usage) if answer.get("usage") else None
        return Reply(msgspec.json.encode(answer), usage=usage)

    async def close(self) -> None:
        await close_quietly(self.rest)


class _Assembler:
    """Events in, one answer out; the stream's watch too (`providers.contract.stream.Watch`).
    Subclasses say how a choice grows."""

    object_name = ""

    def __init__(self, choices: int = 1) -> None:
        self.wanted = choices
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.reader = sse.Reader()
        self.data_events = 0
        self.done = False
        self.malformed = False
        self.error_event: bytes | None = None
        self._ended: set[int] = set()

    @property
    def garbage(self) -> bool:
        return self.reader.garbage

    @property
    def broken(self) -> bool:
        """Something came that a finished answer cannot hold."""
        return self.error_event is not None or self.malformed or self.garbage

    @property
    def finished(self) -> bool:
        """Every choice started, and every one asked for, has its `finish_reason`."""
        return bool(self.choices) and self.choices.keys() <= self._ended \
            and len(self._ended) >= self.wanted

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the stream."""
        self.take(chunk)

    def take(self, chunk: bytes) -> bool:
        """`feed`, and whether the stream is done or `broken` (one test for the reader)."""
        found = self.reader.data(chunk)
        if found and found[-1] == sse.DONE:  # where a stream's end comes: not decoded
            del found[-1]
            for data in found:
                self._data(data)
            self.data_events += 1
            self.done = True
            return True
        for data in found:
            self._data(data)
        return self.error_event is not None or self.malformed or self.reader.garbage \
            or self.done

    def flush(self) -> None:
        """The body ended: an event it did not close with a blank line counts too."""
        for event in self.reader.flush():
            self._data(event.data)

    def _data(self, payload: bytes) -> None:
        self.data_events += 1
        if payload == sse.DONE:
            self.done = True
            return
        try:
            event = msgspec.json.decode(payload)
        except (msgspec.DecodeError, UnicodeDecodeError):
            self.malformed = True
            return
        if not isinstance(event, dict):
            self.malformed = True
        elif "error" in event or event.get("object") == "error":
            self.error_event = payload
        else:
            self._event(event)

    def _event(self, event: Mapping[str, Any]) -> None:
        for name in _TOP:
            # The first value given: Azure's first chunk (its prompt's filter results) has a
            # blank id and model and created 0, which the next chunk gives.
            if name not in self.top and event.get(name):
                self.top[name] = event[name]
        if event.get("usage"):
            self.usage = event["usage"]
        for choice in event.get("choices") or ():
            index = choice.get("index", 0)
            grown = self.choices.get(index)
            if grown is None:
                grown = self.choices[index] = self._new(index)
            self._grow(grown, choice)
            if choice.get("finish_reason") is not None:
                grown["finish_reason"] = choice["finish_reason"]
                self._ended.add(index)
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


class _Delta(msgspec.Struct, forbid_unknown_fields=True):
    role: str | None = None
    content: str | None = None


class _Choice(msgspec.Struct, forbid_unknown_fields=True):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None
    logprobs: None = None
    stop_reason: int | str | msgspec.UnsetType | None = msgspec.UNSET
    matched_stop: int | str | msgspec.UnsetType | None = msgspec.UNSET


class _Chunk(msgspec.Struct):
    """The common chat chunk once its id, created and model are known: one choice's role and
    text, nothing else in its choices (other top-level fields are not kept whole either way).
    Anything more fails to decode as this and takes the general path. Fields it does not name
    are skipped by the decoder, unbuilt: the id, created and model every chunk repeats."""

    choices: list[_Choice] | None = None
    system_fingerprint: Any = None
    service_tier: Any = None
    usage: Any = None
    object: Any = None
    error: Any = msgspec.UNSET


class _FirstChunk(_Chunk):
    """The common chat chunk until its id, created and model are known (`_Chunk`)."""

    id: Any = None
    created: Any = None
    model: Any = None


_CHUNK = msgspec.json.Decoder(_Chunk)
_FIRST_CHUNK = msgspec.json.Decoder(_FirstChunk)
_UNDECODABLE = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError)
_UNSET = msgspec.UNSET


class ChatAssembler(_Assembler):
    """`chat.completion.chunk` events into a `chat.completion`. Text arrives in pieces, kept
    in lists (`_texts`) and joined once in `_done`: appending to a string per event would copy
    the whole answer each time. The common chunk (role and content only) is decoded into typed
    structs (`_FirstChunk`, then `_Chunk`); any other takes the general path, as a dict."""

    object_name = "chat.completion"

    def __init__(self, choices: int = 1) -> None:
        super().__init__(choices)
        self._decode = _FIRST_CHUNK.decode  # `_CHUNK`'s once the id, created and model are in

    def _data(self, payload: bytes) -> None:
        try:
            chunk = self._decode(payload)
        except _UNDECODABLE:
            super()._data(payload)  # says what was wrong with it, as for any event
            return
        self.data_events += 1
        if chunk.error is not _UNSET or chunk.object == "error":
            self.error_event = payload
            return
        if len(self.top) < 5:
            self._take_top(chunk)
        if chunk.usage:
            self.usage = chunk.usage
        for choice in chunk.choices or ():  # one, nearly always: `_grow`'s typed twin, inlined
            index = choice.index
            grown = self.choices.get(index)
            if grown is None:
                grown = self.choices[index] = self._new(index)
            if (delta := choice.delta) is not None:
                if delta.role:
                    grown["message"]["role"] = delta.role
                if (content := delta.content) is not None:
                    texts = grown["_texts"]
                    if (pieces := texts.get("content")) is None:
                        texts["content"] = [content]
                    else:
                        pieces.append(content)
            if choice.finish_reason is not None:
                grown["finish_reason"] = choice.finish_reason
                self._ended.add(index)
            if choice.stop_reason is not _UNSET:
                grown["stop_reason"] = choice.stop_reason
            if choice.matched_stop is not _UNSET:
                grown["matched_stop"] = choice.matched_stop

    def _event(self, event: Mapping[str, Any]) -> None:
        super()._event(event)
        self._typed_later()

    def _take_top(self, chunk: _Chunk) -> None:
        """The first value given of each `_TOP` field (`_event` says why the first), field by
        field: a loop over their names would look each up by name, in every event."""
        top = self.top
        if isinstance(chunk, _FirstChunk):
            if chunk.id and "id" not in top:
                top["id"] = chunk.id
            if chunk.created and "created" not in top:
                top["created"] = chunk.created
            if chunk.model and "model" not in top:
                top["model"] = chunk.model
            self._typed_later()
        if chunk.system_fingerprint and "system_fingerprint" not in top:
            top["system_fingerprint"] = chunk.system_fingerprint
        if chunk.service_tier and "service_tier" not in top:
            top["service_tier"] = chunk.service_tier

    def _typed_later(self) -> None:
        """Once the id, created and model are in, later chunks' are not decoded at all."""
        top = self.top
        if "id" in top and "created" in top and "model" in top:
            self._decode = _CHUNK.decode

    def _new(self, index: int) -> dict[str, Any]:
        return {"index": index, "message": {"role": "assistant", "content": None},
                "logprobs": None, "finish_reason": None, "_texts": {}}

    def _grow(self, grown: dict[str, Any], choice: Mapping[str, Any]) -> None:
        message, texts = grown["message"], grown["_texts"]
        delta = choice.get("delta") or {}
        for name, value in delta.items():
            if name == "role":
                message["role"] = value or message["role"]
            elif name == "tool_calls":
                for call in value or ():
                    _grow_call(message.setdefault("tool_calls", []), call)
            elif name == "function_call" and isinstance(value, dict):
                legacy = message.setdefault("function_call", {"name": [], "arguments": []})
                legacy["name"].append(value.get("name") or "")
                legacy["arguments"].append(value.get("arguments") or "")
            elif isinstance(value, str):  # content, refusal, reasoning, reasoning_content
                texts.setdefault(name, []).append(value)
            elif name not in message and name not in texts:
                message[name] = value
        if (logprobs := choice.get("logprobs")) is not None:
            grown["logprobs"] = grown["logprobs"] or {"content": None, "refusal": None}
            for part in ("content", "refusal"):
                if logprobs.get(part) is not None:
                    kept = grown["logprobs"][part]
                    if kept is None:
                        kept = grown["logprobs"][part] = []
                    kept.extend(logprobs[part])

    def _done(self, grown: dict[str, Any]) -> dict[str, Any]:
        message = grown["message"]
        for name, pieces in grown.pop("_texts").items():
            message[name] = "".join(pieces)
        if isinstance(legacy := message.get("function_call"), dict):
            message["function_call"] = {key: "".join(value) for key, value in legacy.items()}
        for call in message.get("tool_calls") or ():
            function = call["function"]
            function["name"] = "".join(function["name"])
            function["arguments"] = "".join(function["arguments"])
        message.setdefault("refusal", None)
        if message.get("tool_calls") and not message.get("content"):
            message["content"] = None  # as whole answers with tool calls say it
        return grown


def _grow_call(calls: list[dict[str, Any]], delta: Mapping[str, Any]) -> None:
    index = delta.get("index", len(calls))
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": [], "arguments": []}})
    call = calls[index]
    for name, value in delta.items():
        if name == "function":
            function = value or {}
            call["function"]["name"].append(function.get("name") or "")
            call["function"]["arguments"].append(function.get("arguments") or "")
        elif name != "index" and value:  # id, type, and what a kind adds (extra_content)
            call[name] = value


class CompletionAssembler(_Assembler):
    """Legacy `text_completion` events into one `text_completion`."""

    object_name = "text_completion"

    def _new(self, index: int) -> dict[str, Any]:
        return {"text": [], "index": index, "logprobs": None, "finish_reason": None}

    def _grow(self, grown: dict[str, Any], choice: Mapping[str, Any]) -> None:
        grown["text"].append(choice.get("text") or "")
        logprobs = choice.get("logprobs")
        if not logprobs:
            return
        merged = grown["logprobs"] = grown["logprobs"] or {name: [] for name in _TEXT_LOGPROBS}
        for name in _TEXT_LOGPROBS:
            merged[name].extend(logprobs.get(name) or ())

    def _done(self, grown: dict[str, Any]) -> dict[str, Any]:
        grown["text"] = "".join(grown["text"])
        return grown
