"""A request's worst-case cost, reserved against its budgets before it is sent (pure).

The prompt is taken at a token per four bytes of the body as it will go upstream (a Responses
turn's stored conversation included), its JSON syntax included: more than the prompt holds,
never less, and no second parse of a large body on the request path; token ids (embeddings of
token arrays) count at least one token each. The answer is the longest the request allows: the
largest of its `max_tokens` spellings (kinds and bridges send that one), else the model's longest
answer, else `DEFAULT_OUTPUT`, raised to a thinking budget's room where the body asks one, times
the answers it asks for (`n`, `best_of`). The price is the dearest of every candidate the
request may reach, its fallbacks' included, so whichever answers, the hold covers it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.accounts.account import NANO
from gateway.adapters.native import UPLOADS
from gateway.core.record import Record
from gateway.core.settings import Route
from providers.contract.chat import output_limit
from providers.contract.messages import THINKING_ROOM, thinking_budget
from providers.contract.usage import Price, Usage, cost

DEFAULT_OUTPUT = 4096  # a model's longest answer when neither the request nor its facts say
EMBEDDINGS = "embeddings"


@dataclass(frozen=True, slots=True)
class Need:
    """What a request may use: prompt tokens (estimated), answer tokens asked for each answer
    (0: unsaid), and how many answers."""

    prompt: int
    output: int = 0
    answers: int = 1
    least: int = 0  # the shortest answer length sent (a thinking budget raises it)


class _Asked(msgspec.Struct):
    """The answer's length and count a request asks for, in each endpoint's spelling. Untyped:
    a field of an odd type must not make the others unread (the upstream judges it)."""

    max_tokens: Any = None
    max_completion_tokens: Any = None
    max_output_tokens: Any = None
    n: Any = None
    best_of: Any = None  # legacy completions: generated upstream, billed, one returned
    # The reasoning switches a Messages upstream turns into a thinking budget.
    reasoning_effort: Any = None
    enable_thinking: Any = None
    chat_template_kwargs: Any = None


_ASKED = msgspec.json.Decoder(_Asked)


def estimate(endpoint: str, raw: bytes, head: Any = None, history: int = 0) -> Need:
    """What a request body asks for; `head` is its parsed head (token ids are read from it),
    `history` the bytes of a stored conversation it continues."""
    prompt = (len(raw) + history + 3) // 4
    if endpoint == EMBEDDINGS:
        return Need(max(prompt, _token_ids(getattr(head, "input", None))))
    if endpoint in UPLOADS:  # audio or an image, not text: its bytes are no token count
        return Need(0)
    try:
        asked = _ASKED.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Need(prompt)
    said = output_limit(asked.max_tokens, asked.max_completion_tokens, asked.max_output_tokens)
    thinking = thinking_budget({"reasoning_effort": asked.reasoning_effort,
                                "enable_thinking": asked.enable_thinking,
                                "chat_template_kwargs": asked.chat_template_kwargs})
    # `output_limit` reads counts as it reads lengths: the largest positive integer said.
    return Need(prompt, said or 0, output_limit(asked.n, asked.best_of) or 1,
                thinking + THINKING_ROOM if thinking else 0)


def _token_ids(given: Any) -> int:
    """Token ids in an embeddings input (a list of ids, or of lists of ids): each is a token."""
    if not isinstance(given, list):
        return 0
    return sum(len(item) if isinstance(item, list) else isinstance(item, int) for item in given)


def worst_case(endpoint: str, need: Need, reach: Iterable[tuple[str, Route]],
               prices: Mapping[tuple[str, str], Price]) -> int:
    """Nano-dollars to hold for `need` served by any of `reach` ((alias, route) pairs); at
    least one nano-dollar, so a budget that is spent refuses even a request that is free."""
    dearest = 0.0
    for alias, route in reach:
        price = prices.get((route.provider, alias))
        if price is None:
            continue
        output = 0 if endpoint == EMBEDDINGS \
            else max(need.output or route.max_output_tokens or DEFAULT_OUTPUT, need.least) \
            * need.answers
        # Every prompt token at its dearest: a request may write them all to a prompt cache.
        dollars = (need.prompt * max(price.input, price.cache_write or 0.0)
                   + output * price.output) / 1_000_000
        dearest = max(dearest, dollars)
    return max(1, _ceil_nano(dearest))


def priced(endpoint: str, need: Need, price: Price, cached: bool = False) -> float:
    """Dollars `need` costs at `price`, as price routing compares candidates: its prompt (at the
    cached-input price when the request marks a cache breakpoint and the price has one) and the
    answers it asks for (`DEFAULT_OUTPUT` each when it says no length)."""
    prompt = price.cached_input if cached and price.cached_input is not None else price.input
    output = 0 if endpoint == EMBEDDINGS \
        else max(need.output or DEFAULT_OUTPUT, need.least) * need.answers
    return (need.prompt * prompt + output * price.output) / 1_000_000


def _ceil_nano(usd: float) -> int:
    return -int(-usd * NANO // 1)


def cut_cost(prompt: int, events: int, price: Price | None) -> float | None:
    """What a stream cut before its usage came is charged: its prompt and a token per event it
    relayed (an event carries at most a few tokens); None without a price."""
    if price is None:
        return None
    return cost(Usage(prompt_tokens=prompt, completion_tokens=events), price)


def charged(record: Record, prompt: int, price_of: Callable[[str, str], Price | None]
            ) -> float | None:
    """What a request that ended is charged, as its spend row and the request log say: nothing
    for an answer kept from an earlier request, what its usage cost, else a cut stream's
    prompt and events, with the tries billed beside it; `prompt`: the tokens its hold estimated,
    `price_of`: (provider, alias) -> price."""
    if record.cache_hit or record.replayed:  # the first request paid for it
        return 0.0
    if record.cost is not None:
        return record.cost
    if record.events and record.provider is not None and record.alias is not None:
        cost = cut_cost(prompt, record.events, price_of(record.provider, record.alias))
        if cost is not None:
            return cost + record.billed_aside()
    aside = record.billed_aside()
    return aside if aside else None  # no usage of its own, but tries billed
