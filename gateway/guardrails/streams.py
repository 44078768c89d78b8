"""A stream's text screened and its placeholders given back as it arrives, in every dialect.

Each text a stream writes piece by piece (a choice's content, a tool call's arguments, an
Anthropic content block, a Responses delta) is a *channel*. What a channel's delta may still
need (the start of a placeholder, `[EMA`, whose end `IL_1]` is in the next delta) is held back,
at most `MAX_PLACEHOLDER` characters, and written with the next delta, or in an event of its
own when the channel ends. With guardrails on the output side, a channel also keeps the last
`MAX_PLACEHOLDER` characters (and a match that reaches into them) until what follows shows
whether they are a value: a bounded window, never the whole stream. A block raises
`GuardrailViolation` before the matched text is written.

Events that are no delta (a stream's end, a Responses `.done` event that repeats the text) are
screened whole, after the channels they end are flushed. An event with no possible placeholder
and nothing held passes as the bytes it came in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.guardrails.policies import Guardrail
from gateway.guardrails.screening import MAX_PLACEHOLDER, Screening
from providers.wire import sse

# What may begin a placeholder in an event's bytes: `[` before a capital, or ending a string.
_MAYBE = re.compile(rb'\[(?:[A-Z]|")')
_PARTIAL = re.compile(r"\[[A-Z0-9_]{0,62}\Z")
_CHAT_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")
_BLOCK_FIELDS = ("text", "partial_json", "thinking")


Shape = Callable[[str], dict[str, Any]]  # an event carrying only this text of a channel


@dataclass(slots=True)
class _Channel:
    """One text a stream writes in deltas: what it holds back, and how an event carrying
    only its held text looks (the shape of its last delta)."""

    as_json: bool
    pending: str = ""
    shape: Shape | None = None
    name: bytes | None = None


class StreamScreen:
    """One stream's screening, fed its bytes as they come (`feed`), ended once (`end`)."""

    __slots__ = ("_blocks", "_channels", "_framer", "_others", "_screening")

    def __init__(self, screening: Screening, output: Sequence[Guardrail]) -> None:
        self._screening = screening
        self._blocks = tuple(g for g in output if g.action == "block")
        self._others = tuple(g for g in output if g.action != "block")
        self._channels: dict[Hashable, _Channel] = {}
        self._framer = sse.Framer()

    def feed(self, chunk: bytes) -> bytes:
        """The bytes of the events `chunk` completes, screened; a `GuardrailViolation` when an
        output guardrail blocks."""
        complete = self._framer.feed(chunk)
        if not complete:
            return b""
        return b"".join(self._event(raw) for raw in sse.split(complete))

    def end(self) -> bytes:
        """What is left once the upstream's bytes are over: an unfinished event, held text."""
        rest = self._framer.flush()
        return (self._event(rest) if rest else b"") + self._flush(None)

    def _event(self, raw: bytes) -> bytes:
        held = any(channel.pending for channel in self._channels.values())
        if not held and not self._blocks and not self._others and not _MAYBE.search(raw):
            return raw
        event = sse.parse(raw)
        if event is None or event.done:
            return self._flush(None) + raw
        try:
            payload = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            return self._flush(None) + raw
        if not isinstance(payload, dict):
            return self._flush(None) + raw
        deltas, ends = answer_deltas(payload)
        if not deltas:
            flushed = self._flush(ends)
            screened = self._screening.answer(payload, self._others + self._blocks)
            return flushed + (raw if screened is payload
                              else sse.encode(msgspec.json.encode(screened), event.name))
        for key, holder, field, as_json, shape in deltas:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = _Channel(as_json)
            holder[field] = self._take(channel, holder[field], final=_ending(key, ends))
            channel.shape, channel.name = shape, event.name
        return sse.encode(msgspec.json.encode(payload), event.name)

    def _take(self, channel: _Channel, text: str, final: bool = False) -> str:
        """What of `channel`'s text, `text` added, may be written now: screened, restored."""
        pending = channel.pending + text
        cut = len(pending)
        if self._blocks:
            self._screening.screened(pending, self._blocks, "output")  # raises on a match
        if not final:
            if self._others or self._blocks:  # what follows may make the end a value
                cut = max(0, cut - MAX_PLACEHOLDER)
                for guardrail in self._others:
                    for found in guardrail.detector.find(pending):
                        if found.end > cut:
                            cut = min(cut, found.start)
            if partial := _PARTIAL.search(pending, max(0, cut - MAX_PLACEHOLDER), cut):
                cut = partial.start()
        written, channel.pending = pending[:cut], pending[cut:]
        if self._others and written:
            written = self._screening.screened(written, self._others, "output")
        return self._screening.restored(written, channel.as_json)

    def _flush(self, ends: frozenset[Hashable] | None) -> bytes:
        """The held text of the channels `ends` names (None: all), each in an event shaped as
        its last."""
        out = []
        for key, channel in self._channels.items():
            if channel.pending and channel.shape is not None and _ending(key, ends):
                shaped = channel.shape(self._take(channel, "", final=True))
                out.append(sse.encode(msgspec.json.encode(shaped), channel.name))
        return b"".join(out)


def _ending(key: Hashable, ends: frozenset[Hashable] | None) -> bool:
    """Whether the channel `key` ends with this event (a chat choice's finish ends all of its
    channels; None: every channel ends)."""
    return ends is None or (isinstance(key, tuple) and bool(key) and key[0] in ends)


# A delta: its channel, the object holding its text and the text's field, whether the text is
# JSON (a tool call's arguments), the shape of an event carrying only a held text of it.
Delta = tuple[Hashable, dict[str, Any], str, bool, Shape]


def answer_deltas(payload: dict[str, Any]) -> tuple[list[Delta], frozenset[Hashable] | None]:
    """The texts `payload` adds to its channels, and the chat choices it ends; None for an
    event that is neither a delta nor a chat chunk: it ends every channel."""
    choices = payload.get("choices")
    if isinstance(choices, list):
        return _chat_deltas(payload, choices)
    found: list[Delta] = []
    kind = payload.get("type")
    if kind == "content_block_delta" and isinstance(delta := payload.get("delta"), dict):
        for name in _BLOCK_FIELDS:
            if isinstance(delta.get(name), str):
                found.append((("block", payload.get("index"), name), delta, name,
                              name == "partial_json", _block_shape(payload, delta, name)))
    elif isinstance(kind, str) and kind.endswith(".delta") \
            and isinstance(payload.get("delta"), str):
        found.append(((kind, payload.get("item_id") or payload.get("output_index"),
                       payload.get("content_index")), payload, "delta", "arguments" in kind,
                      _block_shape(payload, None, "delta")))
    return found, frozenset() if found else None


def _chat_deltas(payload: dict[str, Any], choices: list[Any]
                 ) -> tuple[list[Delta], frozenset[Hashable] | None]:
    found: list[Delta] = []
    ends = []
    top = {name: value for name, value in payload.items() if name not in ("choices", "usage")}
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        if choice.get("finish_reason"):
            ends.append(index)
        if isinstance(choice.get("text"), str):
            found.append(((index, "text"), choice, "text", False,
                          _choice_shape(top, index, lambda text: {"text": text})))
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            continue
        for name in _CHAT_FIELDS:
            if isinstance(delta.get(name), str):
                found.append(((index, name), delta, name, False,
                              _choice_shape(top, index, _content(name))))
        for call in delta.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                at = call.get("index", 0)
                found.append(((index, "tool", at), function, "arguments", True,
                              _choice_shape(top, index, _arguments(at))))
    return found, frozenset(ends) if choices else None


def _content(name: str) -> Shape:
    return lambda text: {"delta": {name: text}}


def _arguments(at: int) -> Shape:
    return lambda text: {"delta": {"tool_calls": [{"index": at,
                                                   "function": {"arguments": text}}]}}


def _choice_shape(top: dict[str, Any], index: int, part: Shape) -> Shape:
    return lambda text: {**top, "choices": [{"index": index, **part(text),
                                             "finish_reason": None}]}


def _block_shape(payload: dict[str, Any], delta: dict[str, Any] | None, name: str) -> Shape:
    if delta is None:
        return lambda text: {**payload, name: text}
    return lambda text: {**payload, "delta": {**delta, name: text}}
