"""Token usage as upstreams report it, and what it costs at the prices in llms.json."""

from __future__ import annotations

from typing import Annotated

import msgspec

# No answer honestly counts past 2**53 tokens (nor below zero): an upstream usage out of these
# bounds is a bad answer, a failover, and never reaches a key's token spend nor a client.
MAX_TOKENS = 2**53
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS)]


class _Details(msgspec.Struct):
    reasoning_tokens: Tokens | None = None
    cached_tokens: Tokens | None = None
    cache_write_tokens: Tokens | None = None  # prompt tokens written to a prompt cache


class Usage(msgspec.Struct):
    """OpenAI's `usage` object; reasoning tokens are part of `completion_tokens`.

    The Responses API's names (`input_tokens`, `output_tokens`, `*_tokens_details`) are read
    into the same fields.
    """

    prompt_tokens: Tokens = 0
    completion_tokens: Tokens = 0
    total_tokens: Tokens = 0
    completion_tokens_details: _Details | None = None
    prompt_tokens_details: _Details | None = None
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    input_tokens_details: _Details | None = None
    output_tokens_details: _Details | None = None

    def __post_init__(self) -> None:
        if self.input_tokens is not None and not self.prompt_tokens:
            self.prompt_tokens = self.input_tokens
            self.prompt_tokens_details = self.input_tokens_details
        if self.output_tokens is not None and not self.completion_tokens:
            self.completion_tokens = self.output_tokens
            self.completion_tokens_details = self.output_tokens_details

    @property
    def reasoning_tokens(self) -> int:
        details = self.completion_tokens_details
        return (details.reasoning_tokens or 0) if details else 0

    @property
    def cached_tokens(self) -> int:
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details else 0

    @property
    def cache_write_tokens(self) -> int:
        details = self.prompt_tokens_details
        return (details.cache_write_tokens or 0) if details else 0


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """US dollars per million tokens: `cached_input` for prompt tokens read from a prompt
    cache, `cache_write` for those written to one (Anthropic charges a premium for writes)."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None
    cache_write: float | None = None
    # Realtime's audio tokens, when dearer than text (else at `input` / `output`).
    audio_input: float | None = None
    audio_output: float | None = None


class _Response(msgspec.Struct):
    usage: Usage | None = None


class _Carrier(msgspec.Struct):
    usage: Usage | None = None
    response: _Response | None = None  # Responses API events nest it


def from_payload(payload: bytes) -> Usage | None:
    """The `usage` of a JSON answer or stream event, if it has one (other fields are skipped)."""
    try:
        carrier = msgspec.json.decode(payload, type=_Carrier)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return carrier.usage or (carrier.response.usage if carrier.response else None)


def cost(usage: Usage, price: Price) -> float:
    """Dollars for this usage; prompt tokens read from or written to a prompt cache at the
    cached and cache-write prices when they are given, at the input price when not."""
    cached = usage.cached_tokens if price.cached_input is not None else 0
    written = usage.cache_write_tokens if price.cache_write is not None else 0
    fresh = max(0, usage.prompt_tokens - cached - written)
    dollars = (fresh * price.input + cached * (price.cached_input or 0.0)
               + written * (price.cache_write or 0.0) + usage.completion_tokens * price.output)
    return dollars / 1_000_000
