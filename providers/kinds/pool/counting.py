"""What llama.cpp's server leaves out, made up here: usage in streams, one vector per input.

Every request goes to a llama.cpp worker as a stream (whole answers too, assembled by the
gateway), because a stream is how the worker learns its client left. So every answer gets usage
here (and the gateway counts tokens against the key): each content, reasoning or tool call
event is one token (llama.cpp sends one per event), and the prompt is estimated from its
characters. A stream that ends without any event is `EmptyStream`: the engine refused the
request inside it. The usage event goes in before `[DONE]`, as OpenAI places it. Events pass on
re-framed (`sse.encode`): comments are left out, and a line that is no SSE field is
`BadUpstreamResponse`. Its embeddings of a generative model are per token: mean-pooled and
normalised into one vector per input (`pooled`).
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import msgspec

from providers.contract.errors import BadUpstreamResponse
from providers.contract.translate import translated
from providers.wire import sse


def estimated_prompt_tokens(body: Mapping[str, Any]) -> int:
    """About four characters a token of what the messages (or prompt) say."""
    said = body.get("messages") or body.get("prompt") or ""
    return max(1, len(msgspec.json.encode(said)) // 4)


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[Any] | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: dict[str, Any] | None = None


def with_usage(chunks: AsyncGenerator[bytes, None], prompt_tokens: int,
               model: str) -> AsyncGenerator[bytes, None]:
    """`chunks` with a usage event before `[DONE]` when the stream had none of its own;
    EmptyStream when it had no event at all. Closing this closes `chunks` (the worker's
    request: it stops generating)."""
    return translated(chunks, _Counter(prompt_tokens, model))


class EmptyStream(Exception):
    """The engine ended the stream without a single event: it refused the request inside its
    stream (llama.cpp checks some requests only there); asked whole, it says why."""


class _Counter:
    def __init__(self, prompt_tokens: int, model: str) -> None:
        self.prompt_tokens = prompt_tokens
        self.model = model
        self.counted = 0
        self.events = 0
        self.reported = False
        self.reader = sse.Reader()

    def feed(self, chunk: bytes) -> bytes:
        """The events `chunk` completes, the usage event added at `[DONE]`."""
        return self._passed(self.reader.feed(chunk))

    def close(self) -> bytes:
        """At the stream's end: a last event it did not end with a blank line; EmptyStream
        when there was no event at all."""
        out = self._passed(self.reader.flush())
        if not self.events:
            raise EmptyStream
        return out

    def _passed(self, events: list[sse.Event]) -> bytes:
        if self.reader.garbage:  # left out here, it would pass unnoticed by the relay's checks
            raise BadUpstreamResponse("stream is not server-sent events")
        out = []
        for event in events:
            if not event.done:
                self.events += 1
                try:
                    parsed = msgspec.json.decode(event.data, type=_Event)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    parsed = _Event()  # the relay's own checks judge it
                self.reported = self.reported or parsed.usage is not None
                self.counted += sum(1 for c in parsed.choices or () if _says_something(c))
            elif not self.reported:
                out.append(_usage_event(self.model, self.prompt_tokens, self.counted))
                self.reported = True
            out.append(sse.encode(event.data, event.name))
        return b"".join(out)


def _says_something(choice: _Choice) -> bool:
    delta = choice.delta
    if delta is not None:
        return bool(delta.content or delta.reasoning_content or delta.tool_calls)
    return bool(choice.text)


def _usage_event(model: str, prompt: int, completion: int) -> bytes:
    return sse.encode(msgspec.json.encode({
        "id": "usage", "object": "chat.completion.chunk", "model": model, "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion}}))


class _TokenVectors(msgspec.Struct):
    # One vector, or one per token: msgspec takes one array type per union, so the element is
    # either a number or a list of numbers.
    embedding: list[float | list[float]]
    index: int = 0


class _TokenList(msgspec.Struct):
    data: list[_TokenVectors]
    usage: dict[str, Any] | None = None


def pooled(payload: bytes, expected: int) -> tuple[list[list[float]], int | None]:
    """One vector per input from a llama.cpp embeddings answer, whose vectors are per token
    for a generative model (mean-pooled and normalised here); and its prompt tokens."""
    try:
        answer = msgspec.json.decode(payload, type=_TokenList)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not an embedding list: {exc}") from None
    if len(answer.data) != expected:
        raise BadUpstreamResponse(f"answered {len(answer.data)} embeddings for {expected} "
                                  "inputs")
    vectors = []
    for item in sorted(answer.data, key=lambda d: d.index):
        rows = item.embedding
        tokens = [row for row in rows if isinstance(row, list)]
        if tokens and len(tokens) == len(rows):
            try:
                mean = [sum(column) / len(tokens) for column in zip(*tokens, strict=True)]
            except ValueError:  # token vectors of different lengths
                raise BadUpstreamResponse("token vectors differ in length") from None
        elif not tokens:
            mean = [float(x) for x in rows if not isinstance(x, list)]
        else:
            raise BadUpstreamResponse("an embedding mixes numbers and vectors")
        norm = math.sqrt(sum(x * x for x in mean)) or 1.0
        vectors.append([x / norm for x in mean])
    usage = answer.usage or {}
    prompt = usage.get("prompt_tokens")
    return vectors, prompt if isinstance(prompt, int) else None
