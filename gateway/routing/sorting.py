"""Candidates sorted for one request: by its price, by time to first token, by tokens per second,
and bounded by `max_price` (pure, but for the throughputs measured).

A request asks with `x-llms-sort` or OpenRouter's body field `provider: {"sort", "max_price"}`
(taken out of the body before it goes upstream: it is OpenRouter's, not OpenAI's), an alias
with `routing.strategy` and `routing.max_price`. Sorting only changes the order: failover,
breakers and hedging go through the sorted candidates as through the file's order. Ties keep
file order (Python's sort is stable).

- `price`: what this request would cost at each candidate's prices (the caller's `cost`);
  a candidate with no known price goes last.
- `latency`: the lowest measured time to first token first; unmeasured first, to be measured.
- `throughput`: the most tokens per second measured on streamed answers first (output tokens
  over the stream's time after its first token); unmeasured first, to be measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.core.settings import MaxPrice, Route
from providers.contract.errors import InvalidRequest
from providers.contract.usage import Price

SORTS = ("price", "latency", "throughput")
HEADER = "x-llms-sort"
# How much one new stream moves a candidate's average tokens per second.
SMOOTHING = 0.3


@dataclass(slots=True)
class Throughputs:
    """Recent output tokens per second per (provider, upstream model), of streamed answers."""

    averages: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, provider: str, upstream_model: str, per_second: float) -> None:
        key = (provider, upstream_model)
        previous = self.averages.get(key)
        self.averages[key] = per_second if previous is None \
            else previous + SMOOTHING * (per_second - previous)

    def of(self, route: Route) -> float | None:
        return self.averages.get((route.provider, route.upstream_model))

    def retain(self, routes: Iterable[Route]) -> None:
        """Forget what the config no longer routes to."""
        kept = {(r.provider, r.upstream_model) for r in routes}
        self.averages = {k: v for k, v in self.averages.items() if k in kept}


def sort_of(value: Any, param: str) -> str:
    """`value` as a sort, or a 400 naming `param`."""
    if value not in SORTS:
        raise InvalidRequest(f"Invalid {param}: {value!r}; expected one of "
                             + ", ".join(f"'{s}'" for s in SORTS), param=param)
    return str(value)


class _Preferences(msgspec.Struct):
    """OpenRouter's `provider` object: what the gateway honours of it (the rest is read as
    OpenRouter's routing preferences this gateway does not have, and dropped)."""

    sort: Any = None
    max_price: Any = None


def taken(raw: bytes) -> tuple[bytes, str | None, MaxPrice | None]:
    """`raw` without its top-level `provider` object, and the sort and price bound it asked
    for; `raw` itself when it has none (the bytes `"provider"` said something else)."""
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return raw, None, None
    if not isinstance(body, dict) or "provider" not in body:
        return raw, None, None
    given = body.pop("provider")
    stripped = msgspec.json.encode(body)
    if given is None:
        return stripped, None, None
    try:
        asked = msgspec.convert(given, _Preferences)
    except msgspec.ValidationError:
        raise InvalidRequest("Invalid provider: expected an object", param="provider") from None
    sort = None if asked.sort is None else sort_of(asked.sort, "provider.sort")
    ceiling = None
    if asked.max_price is not None:
        try:
            ceiling = msgspec.convert(asked.max_price, MaxPrice)
        except msgspec.ValidationError as exc:
            raise InvalidRequest(f"Invalid provider.max_price: {exc} (expected "
                                 '{"prompt": usd, "completion": usd} per million tokens)',
                                 param="provider.max_price") from None
    return stripped, sort, ceiling


def by_price(routes: tuple[Route, ...], cost: Callable[[Route], float | None]
             ) -> tuple[Route, ...]:
    """The cheapest for this request first; those with no known price last, in file order."""
    costs = {route: cost(route) for route in routes}
    return tuple(sorted(routes, key=lambda r: (costs[r] is None, costs[r] or 0.0)))


def by_latency(routes: tuple[Route, ...], ttft: Callable[[Route], float | None]
               ) -> tuple[Route, ...]:
    """Unmeasured first (to be measured), then the fastest to a first token."""
    return tuple(sorted(routes, key=lambda r: _measured(ttft(r))))


def by_throughput(routes: tuple[Route, ...], throughputs: Throughputs) -> tuple[Route, ...]:
    """Unmeasured first (to be measured), then the most tokens per second."""
    return tuple(sorted(routes, key=lambda r: _measured(throughputs.of(r), -1.0)))


def _measured(value: float | None, sign: float = 1.0) -> tuple[int, float]:
    return (0, 0.0) if value is None else (1, sign * value)


def within(routes: tuple[Route, ...], ceilings: tuple[MaxPrice, ...],
           price_of: Callable[[Route], Price | None]) -> tuple[Route, ...]:
    """The candidates no dearer than every ceiling; one with no known price is not."""
    def fits(route: Route) -> bool:
        price = price_of(route)
        return price is not None and all(
            (c.prompt is None or price.input <= c.prompt)
            and (c.completion is None or price.output <= c.completion) for c in ceilings)
    return tuple(route for route in routes if fits(route))


def per_million(price: Price) -> str:
    """A price as messages write it: `$0.37/M prompt, $1.13/M completion`."""
    return f"{usd(price.input)}/M prompt, {usd(price.output)}/M completion"


def usd(amount: float) -> str:
    """Dollars with cents, and the digits beyond them that say something: $3.00, $0.075."""
    whole, _, cents = f"{amount:.6f}".rstrip("0").partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def too_dear(alias: str, ceilings: tuple[MaxPrice, ...], cheapest: Price | None,
             param: str) -> InvalidRequest:
    """The 400 for a request no candidate of `alias` may serve within `max_price`."""
    said = "; ".join(", ".join(f"{side} {usd(limit)}/M" for side, limit in
                               (("prompt", c.prompt), ("completion", c.completion))
                               if limit is not None) or "no bound" for c in ceilings)
    found = f"the cheapest is {per_million(cheapest)}" if cheapest is not None \
        else "none of them has a known price"
    return InvalidRequest(f"No provider of model '{alias}' is within max_price ({said}): "
                          f"{found}", param=param)
