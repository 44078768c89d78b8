"""What is known of each upstream model: its context window, longest answer and price.

llms.json says it first (`context_window`, `max_output_tokens`, `price` in a provider's model
entry); what it leaves out comes from genai-prices (pydantic's model and price database, kept
up to date by others; no table of ours to forget). Each number remembers where it came from,
for `llms-gateway ls`.

A window is the model's wherever it runs, so it is looked up by the provider's URL, else by the
model's name. A price is the provider's: it is taken only from the provider the package knows
by its URL (a model served on this machine or by an unknown host is not priced for it).
genai-prices has no maximum output length: that one comes from llms.json only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from genai_prices import data_snapshot

from providers.contract.spec import ModelEntry
from providers.contract.usage import Price

CONFIG = "config"
PACKAGE = "genai-prices"


@dataclass(frozen=True, slots=True)
class Facts:
    """One upstream model's numbers, and where each came from (`CONFIG` or `PACKAGE`)."""

    context_window: int | None = None
    max_output_tokens: int | None = None
    price: Price | None = None
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unpriced:
    """An alias served by a provider whose model no price is known for (`defaults.unpriced`)."""

    alias: str
    provider: str
    model: str


def facts(model: ModelEntry, base_url: str | None) -> Facts:
    """`model`'s facts: llms.json's, else the package's for its id at `base_url`."""
    window, output, price = model.context_window, model.max_output_tokens, model.price
    sources = {name: CONFIG for name, value in (("context_window", window),
                                                ("max_output_tokens", output),
                                                ("price", price)) if value is not None}
    if window is None or price is None:
        known = _known(model.id.lower(), base_url)
        if window is None and known.window is not None:
            window, sources["context_window"] = known.window, PACKAGE
        if price is None and known.price is not None:
            price, sources["price"] = known.price, PACKAGE
    return Facts(window, output, price, sources)


def siblings_filled(known: Facts, siblings: list[Facts]) -> Facts:
    """`known` with what llms.json does not say of it taken from what llms.json says of other
    aliases of one provider naming the same upstream model: the operator's word on a model
    (the price it pays, say) holds for every name of it, over the package's."""
    values: dict[str, Any] = {"context_window": known.context_window,
                              "max_output_tokens": known.max_output_tokens,
                              "price": known.price}
    sources = dict(known.sources)
    for sibling in siblings:
        for name in values:
            if sources.get(name) != CONFIG and sibling.sources.get(name) == CONFIG:
                values[name], sources[name] = getattr(sibling, name), CONFIG
    if sources == known.sources:
        return known
    return Facts(values["context_window"], values["max_output_tokens"], values["price"],
                 sources)


@dataclass(frozen=True, slots=True)
class _Known:
    window: int | None = None
    price: Price | None = None


@functools.lru_cache(maxsize=4096)
def _known(model_id: str, base_url: str | None) -> _Known:
    """The package's window and price for a model id (lower case) at a URL; cached: config
    reloads ask again for the same models."""
    snapshot = data_snapshot.get_snapshot()
    if base_url:
        try:
            _, found = snapshot.find_provider_model(model_id, None, None, base_url)
        except LookupError:
            pass
        else:
            return _Known(found.context_window, _price(found.get_prices(datetime.now(tz=UTC))))
    try:  # an unknown host: the model's window, by its name
        _, found = snapshot.find_provider_model(model_id, None, None, None)
    except LookupError:
        return _Known()
    return _Known(found.context_window)


def _price(prices: Any) -> Price | None:
    """The package's price in llms.json's terms (dollars per million tokens); tiered prices at
    their base tier. None when it has no token price (a subscription)."""
    rates = [_rate(getattr(prices, name, None))
             for name in ("input_mtok", "output_mtok", "cache_read_mtok")]
    if rates[0] is None and rates[1] is None:
        return None
    return Price(input=rates[0] or 0.0, output=rates[1] or 0.0, cached_input=rates[2])


def _rate(value: Any) -> float | None:
    if isinstance(value, Decimal):
        return float(value)
    base = getattr(value, "base", None)  # TieredPrices
    return float(base) if isinstance(base, Decimal) else None
