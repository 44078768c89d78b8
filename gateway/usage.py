"""Token usage as upstreams report it, and what it costs at the prices in llms.json."""

from __future__ import annotations

import msgspec


class _Details(msgspec.Struct):
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None


class Usage(msgspec.Struct):
    """OpenAI's `usage` object; reasoning tokens are part of `completion_tokens`."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    completion_tokens_details: _Details | None = None
    prompt_tokens_details: _Details | None = None

    @property
    def reasoning_tokens(self) -> int:
        details = self.completion_tokens_details
        return (details.reasoning_tokens or 0) if details else 0

    @property
    def cached_tokens(self) -> int:
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details else 0


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """US dollars per million tokens."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None


class _Carrier(msgspec.Struct):
    usage: Usage | None = None


def from_payload(payload: bytes) -> Usage | None:
    """The `usage` of a JSON answer or stream event, if it has one (other fields are skipped)."""
    try:
        return msgspec.json.decode(payload, type=_Carrier).usage
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def cost(usage: Usage, price: Price) -> float:
    """Dollars for this usage; cached prompt tokens at the cached price when one is given."""
    cached = usage.cached_tokens if price.cached_input is not None else 0
    fresh = usage.prompt_tokens - cached
    dollars = (fresh * price.input + cached * (price.cached_input or 0.0)
               + usage.completion_tokens * price.output)
    return dollars / 1_000_000
