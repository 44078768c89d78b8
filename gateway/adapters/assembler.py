"""Stream events in, one whole answer out: what `gateway.adapters.assemble` gathers with.

Pure (no I/O): each chunk of an upstream's stream is fed as it comes (`take`), each event
decoded once, every piece kept and joined once at the end (`answer`): every choice, content,
reasoning, refusal, tool calls, logprobs, `finish_reason`, usage, `system_fingerprint`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from providers.wire import sse

# Fields of the first chunk that the whole answer carries as they are.
_TOP = ("id", "created", "model", "system_fingerprint", "service_tier")
_TEXT_LOGPROBS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class Assembler:
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
        done = bool(found) and found[-1] == sse.DONE  # where a stream's end comes
        if done:  # not decoded, as `_data` would try to
            del found[-1]
        self._events(found)
        if done:
            self.data_events += 1
            self.done = True
            return True
        return self.error_event is not None or self.malformed or self.reader.garbage \
            or self.done

    def _events(self, found: list[bytes]) -> None:
        """The data of a chunk's events, in order."""
        for data in found:
            self._data(data)

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
    """The common chat chunk: one choice's role and text, nothing else in its choices (other
    top-level fields are not kept whole either way). Anything more fails to decode as this
    and takes the general path."""

    choices: list[_Choice] | None = None
    id: Any = None
    created: Any = None
    model: Any = None
    system_fingerprint: Any = None
    service_tier: Any = None
    usage: Any = None
    object: Any = None
    error: Any = msgspec.UNSET


_CHUNK = msgspec.json.Decoder(_Chunk)
_TEXT = msgspec.json.Decoder(str)
_UNDECODABLE = (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError)
_UNSET = msgspec.UNSET
_CONTENT = b'"content":"'


class ChatAssembler(Assembler):
    """`chat.completion.chunk` events into a `chat.completion`. Text arrives in pieces, kept
    in lists (`_texts`) and joined once in `_done`: appending to a string per event would copy
    the whole answer each time. The common chunk (role and content only) is decoded into typed
    structs (`_Chunk`); any other takes the general path, as a dict.

    Most of a stream is chunks that differ from each other in their text only: the same id,
    created, model, choice, and the same bytes around the text. The first such chunk (one
    choice, its delta only content) is kept as a template (`_learn`): the bytes before its
    text and after it. A chunk that begins and ends with those same bytes is that chunk with
    another text; only the text is decoded (as a JSON string: escapes, UTF-8, no stray quote),
    and it grows the template's choice as the whole chunk would have.
    """

    object_name = "chat.completion"

    def __init__(self, choices: int = 1) -> None:
        super().__init__(choices)
        self._learning = True  # no template tried yet: one try a stream
        self._before = b""  # the template: its bytes up to and with the text's opening quote,
        self._after = b""  # from the text's closing quote on,
        self._pieces: list[str] = []  # and the content its choice grows

    def _events(self, found: list[bytes]) -> None:
        """Each event the template's (`_learn`) grown by its text, in a loop of its own: no
        call, no attribute read per event; any other by `_data`."""
        before, after, pieces = self._before, self._after, self._pieces
        start, taken = len(before), 0
        for data in found:
            if before:
                end = len(data) - len(after)
                if end >= start and data[:start] == before and data[end:] == after:
                    try:
                        pieces.append(_TEXT.decode(data[start - 1:end + 1]))
                        taken += 1
                        continue
                    except _UNDECODABLE:
                        pass  # not the template's chunk after all: decoded whole
            self._data(data)
            if not before and self._before:  # learnt from it: the next may be its like
                before, after, pieces = self._before, self._after, self._pieces
                start = len(before)
        self.data_events += taken

    def _data(self, payload: bytes) -> None:
        try:
            chunk = _CHUNK.decode(payload)
        except _UNDECODABLE:
            super()._data(payload)  # says what was wrong with it, as for any event
            return
        self.data_events += 1
        if chunk.error is not _UNSET or chunk.object == "error":
            self.error_event = payload
            return
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
                    pieces = grown["_texts"].setdefault("content", [])
                    pieces.append(content)
                    self._learn(payload, chunk, choice, pieces)
            if choice.finish_reason is not None:
                grown["finish_reason"] = choice.finish_reason
                self._ended.add(index)
            if choice.stop_reason is not _UNSET:
                grown["stop_reason"] = choice.stop_reason
            if choice.matched_stop is not _UNSET:
                grown["matched_stop"] = choice.matched_stop

    def _learn(self, payload: bytes, chunk: _Chunk, choice: _Choice, pieces: list[str]
               ) -> None:
        """Keep `payload` as the template if it is a chunk of one choice whose delta is only
        content (no usage either) and its text is found for certain: after the one
        `"content"` key it has, written without spaces, up to the first quote no backslash
        escapes, and decoding to that content. Its top-level fields were taken already, so a
        chunk repeating them adds nothing to them."""
        delta = choice.delta
        if not self._learning or delta is None or delta.role is not None \
                or choice.finish_reason is not None or choice.stop_reason is not _UNSET \
                or choice.matched_stop is not _UNSET or chunk.usage \
                or len(chunk.choices or ()) != 1:
            return
        content = delta.content
        self._learning = False
        at = payload.find(_CONTENT)
        if at < 0 or payload.find(b'"content"') != at or payload.find(b'"content"', at + 1) >= 0:
            return
        start = end = at + len(_CONTENT)
        while (end := payload.find(b'"', end)) >= 0:
            escapes = end
            while payload[escapes - 1] == 0x5C:  # a backslash
                escapes -= 1
            if (end - escapes) % 2 == 0:
                break
            end += 1
        if end < 0 or _TEXT.decode(payload[start - 1:end + 1]) != content:
            return
        self._before, self._after, self._pieces = payload[:start], payload[end:], pieces

    def _take_top(self, chunk: _Chunk) -> None:
        """The first value given of each `_TOP` field (`_event` says why the first), field by
        field: a loop over their names would look each up by name, in every event."""
        top = self.top
        if chunk.id and "id" not in top:
            top["id"] = chunk.id
        if chunk.created and "created" not in top:
            top["created"] = chunk.created
        if chunk.model and "model" not in top:
            top["model"] = chunk.model
        if chunk.system_fingerprint and "system_fingerprint" not in top:
            top["system_fingerprint"] = chunk.system_fingerprint
        if chunk.service_tier and "service_tier" not in top:
            top["service_tier"] = chunk.service_tier

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


class CompletionAssembler(Assembler):
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
