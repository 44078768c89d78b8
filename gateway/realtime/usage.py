"""What a Realtime session's responses used, and what it costs (pure).

Each `response.done` event carries its response's `usage`: input and output tokens, each split
into text and audio, and the input tokens read from the prompt cache (text and audio). Audio is
priced at the model's `price.audio_input` / `price.audio_output` when llms.json gives them,
else at `input` / `output`; cached tokens at `cached_input` when given. A session's tokens add
up over its responses (`Tally`), as the one record of the session keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from providers.contract.usage import Price, Tokens, Usage


class _Cached(msgspec.Struct):
    text_tokens: Tokens = 0
    audio_tokens: Tokens = 0


class _InputDetails(msgspec.Struct):
    text_tokens: Tokens | None = None
    audio_tokens: Tokens = 0
    cached_tokens: Tokens = 0
    cached_tokens_details: _Cached | None = None


class _OutputDetails(msgspec.Struct):
    text_tokens: Tokens | None = None
    audio_tokens: Tokens = 0


class RealtimeUsage(msgspec.Struct):
    """A Realtime response's `usage`, as `response.done` says it."""

    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    input_token_details: _InputDetails | None = None
    output_token_details: _OutputDetails | None = None


class _Response(msgspec.Struct):
    id: str | None = None
    status: str | None = None
    usage: RealtimeUsage | None = None


class Event(msgspec.Struct):
    """What the gateway reads of a server event: its type, and a `response.done`'s response."""

    type: str = ""
    response: _Response | None = None


EVENT = msgspec.json.Decoder(Event)


@dataclass(frozen=True, slots=True)
class Split:
    """One response's tokens by kind: fresh text and audio in, cached in, text and audio out."""

    text_in: int
    audio_in: int
    cached_text: int
    cached_audio: int
    text_out: int
    audio_out: int

    @property
    def input(self) -> int:
        return self.text_in + self.audio_in + self.cached_text + self.cached_audio

    @property
    def output(self) -> int:
        return self.text_out + self.audio_out


def split(usage: RealtimeUsage) -> Split:
    """`usage` by kind; what its details leave out is text (never a negative count)."""
    given_in, given_out = usage.input_token_details, usage.output_token_details
    audio_in = given_in.audio_tokens if given_in else 0
    text_in = given_in.text_tokens if given_in and given_in.text_tokens is not None \
        else max(0, usage.input_tokens - audio_in)
    cached = given_in.cached_tokens if given_in else 0
    if given_in and given_in.cached_tokens_details is not None:
        cached_text = min(text_in, given_in.cached_tokens_details.text_tokens)
        cached_audio = min(audio_in, given_in.cached_tokens_details.audio_tokens)
    else:
        cached_text = min(text_in, cached)
        cached_audio = min(audio_in, cached - cached_text)
    audio_out = given_out.audio_tokens if given_out else 0
    text_out = given_out.text_tokens if given_out and given_out.text_tokens is not None \
        else max(0, usage.output_tokens - audio_out)
    return Split(text_in - cached_text, audio_in - cached_audio, cached_text, cached_audio,
                 text_out, audio_out)


def cost(tokens: Split, price: Price) -> float:
    """Dollars for one response's tokens at `price` (per million tokens)."""
    audio_in = price.audio_input if price.audio_input is not None else price.input
    audio_out = price.audio_output if price.audio_output is not None else price.output
    cached_text = price.cached_input if price.cached_input is not None else price.input
    cached_audio = price.cached_input if price.cached_input is not None else audio_in
    dollars = (tokens.text_in * price.input + tokens.audio_in * audio_in
               + tokens.cached_text * cached_text + tokens.cached_audio * cached_audio
               + tokens.text_out * price.output + tokens.audio_out * audio_out)
    return dollars / 1_000_000


@dataclass(slots=True)
class Tally:
    """A session's responses and their tokens, added up."""

    responses: int = 0
    input: int = 0
    output: int = 0
    cached: int = 0
    audio_in: int = 0
    audio_out: int = 0
    dollars: float = 0.0
    priced: bool = False

    def add(self, tokens: Split, dollars: float | None) -> None:
        self.responses += 1
        self.input += tokens.input
        self.output += tokens.output
        self.cached += tokens.cached_text + tokens.cached_audio
        self.audio_in += tokens.audio_in + tokens.cached_audio
        self.audio_out += tokens.audio_out
        if dollars is not None:
            self.dollars += dollars
            self.priced = True

    def usage(self) -> Usage | None:
        """The session's tokens as a request's `usage` (None before any response)."""
        if not self.responses:
            return None
        return msgspec.convert({"prompt_tokens": self.input, "completion_tokens": self.output,
                                "total_tokens": self.input + self.output,
                                "prompt_tokens_details": {"cached_tokens": self.cached}},
                               Usage)
