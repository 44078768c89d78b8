"""A request's own routing preferences, and its candidates ordered by them and by its alias's.

A request may ask for a sort (`x-llms-sort`, or OpenRouter's body field `provider.sort`) and a
price bound (`provider.max_price`); an alias may say `routing.strategy: "price"` and
`routing.max_price`. What the request asked is its `Asked`, made by admission only when the
request asks something or some alias of the config prices its candidates: a plain request to
a config that never sorts by price pays for nothing here. The request's estimate (its prompt
and the answer it asks for, `gateway.accounts.pricing.estimate`) is made once, by the first
alias that prices its candidates, its fallbacks' included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.accounts import pricing
from gateway.core.settings import MaxPrice, Route, Snapshot
from gateway.routing import sorting, strategy
from gateway.state.runtime import Runtime
from providers.contract.usage import Price


@dataclass(slots=True)
class Asked:
    """One request's sort and price bound, and what pricing it reads of its body."""

    endpoint: str
    raw: bytes
    head: Any
    sort: str | None = None
    ceiling: MaxPrice | None = None  # the request's own `provider.max_price`
    _need: pricing.Need | None = None

    def need(self) -> pricing.Need:
        if self._need is None:
            self._need = pricing.estimate(self.endpoint, self.raw, self.head)
        return self._need

    def cost(self, price: Price) -> float:
        """Dollars this request costs at `price` (a cache breakpoint: the cached-input price)."""
        return pricing.priced(self.endpoint, self.need(), price, b'"cache_control"' in self.raw)


def prices_routes(snapshot: Snapshot) -> bool:
    """Whether some alias of `snapshot` orders or bounds its candidates by price."""
    return any(p.routing.strategy == "price" or p.routing.max_price is not None
               for p in (snapshot.default_policy, *snapshot.policies.values()))


def asked(endpoint: str, headers: Mapping[str, str], raw: bytes, head: Any, always: bool
          ) -> tuple[bytes, Asked | None]:
    """The body to forward (without OpenRouter's `provider` object) and what the request asks
    (None when it asks nothing and not `always`); a 400 naming the param of a bad sort."""
    sort: str | None = None
    ceiling: MaxPrice | None = None
    if b'"provider"' in raw:
        raw, sort, ceiling = sorting.taken(raw)
    header = headers.get(sorting.HEADER)
    if header is not None:  # the header wins over the body's `provider.sort`
        sort = sorting.sort_of(header.strip().lower(), sorting.HEADER)
    if sort is None and ceiling is None and not always:
        return raw, None
    return raw, Asked(endpoint, raw, head, sort, ceiling)


def ordered(runtime: Runtime, alias: str, routes: tuple[Route, ...], asked: Asked
            ) -> tuple[Route, ...]:
    """`routes` of `alias` within every price bound in force and in the order the request's
    sort (else the alias's strategy) gives; a 400 naming `max_price` when none is within it."""
    live = runtime.live
    policy = live.snapshot.policy(alias).routing
    unknown = {(u.provider, u.alias) for u in live.unpriced} if live.unpriced else set()

    def price_of(route: Route) -> Price | None:
        key = (route.provider, alias)
        return None if key in unknown else live.prices.get(key)

    def cost(route: Route) -> float | None:
        price = price_of(route)
        return None if price is None else asked.cost(price)

    ceilings = tuple(c for c in (policy.max_price, asked.ceiling) if c is not None)
    if ceilings:
        kept = sorting.within(routes, ceilings, price_of)
        if not kept:
            priced = [r for r in routes if price_of(r) is not None]
            cheapest = price_of(min(priced, key=lambda r: cost(r) or 0.0)) if priced else None
            param = "provider.max_price" if asked.ceiling is not None else "max_price"
            raise sorting.too_dear(alias, ceilings, cheapest, param)
        routes = kept
    return strategy.ordered(alias, routes, policy, runtime.spread, runtime.latencies,
                            throughputs=runtime.throughputs, sort=asked.sort, cost=cost)
