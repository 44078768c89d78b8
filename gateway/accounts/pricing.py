"""A request's worst-case cost, reserved against its budgets before it is sent (pure).

The prompt is taken at a token per four bytes of the body, its JSON syntax included: more than
the prompt holds, never less, and no second parse of a large body on the request path. The
answer is the longest the request allows: its own `max_tokens` (or its spellings), else the
model's longest answer, else `DEFAULT_OUTPUT`. The price is the dearest of the candidates', so
whichever answers, the hold covers it.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gateway.accounts.account import NANO
from gateway.adapters.native import UPLOADS
from gateway.core.settings import Route
from providers.contract.usage import Price, Usage, cost

DEFAULT_OUTPUT = 4096  # a model's longest answer when neither the request nor its facts say
EMBEDDINGS = "embeddings"


class _Asked(msgspec.Struct):
    """The answer's length a request asks for, in each endpoint's spelling."""

    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    max_output_tokens: int | None = None


_ASKED = msgspec.json.Decoder(_Asked)


def estimate(endpoint: str, raw: bytes) -> tuple[int, int]:
    """(prompt tokens, output tokens asked for; 0 when unsaid) of a request body."""
    prompt = (len(raw) + 3) // 4
    if endpoint == EMBEDDINGS:
        return prompt, 0
    if endpoint in UPLOADS:  # audio or an image, not text: its bytes are no token count
        return 0, 0
    try:
        asked = _ASKED.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return prompt, 0
    said = asked.max_completion_tokens or asked.max_tokens or asked.max_output_tokens or 0
    return prompt, max(said, 0)


def worst_case(endpoint: str, raw: bytes, alias: str, routes: tuple[Route, ...],
               prices: Mapping[tuple[str, str], Price]) -> tuple[int, int]:
    """(nano-dollars to hold, prompt tokens estimated); at least one nano-dollar, so a budget
    that is spent refuses even a request no price is known for."""
    prompt, asked = estimate(endpoint, raw)
    dearest = 0.0
    for route in routes:
        price = prices.get((route.provider, alias))
        if price is None:
            continue
        output = 0 if endpoint == EMBEDDINGS else asked or route.max_output_tokens \
            or DEFAULT_OUTPUT
        # Every prompt token at its dearest: a request may write them all to a prompt cache.
        dollars = (prompt * max(price.input, price.cache_write or 0.0)
                   + output * price.output) / 1_000_000
        dearest = max(dearest, dollars)
    return max(1, _ceil_nano(dearest)), prompt


def _ceil_nano(usd: float) -> int:
    return -int(-usd * NANO // 1)


def cut_cost(prompt: int, events: int, price: Price | None) -> float | None:
    """What a stream cut before its usage came is charged: its prompt and a token per event it
    relayed (an event carries at most a few tokens); None without a price."""
    if price is None:
        return None
    return cost(Usage(prompt_tokens=prompt, completion_tokens=events), price)
