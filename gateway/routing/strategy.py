"""In which order an alias's candidates are tried: `order`, `weighted` or `latency`; `price` and
`throughput`, and a request's own sort, are `gateway.routing.sorting`'s.

The strategy only chooses who goes first; failover then continues through the others in file order,
and breakers and cooldowns (`gateway.routing.health`) put whoever is excluded last. `weighted`
spreads first tries by the providers' `weight` with smooth weighted round robin (nginx's), so 3:1
is exactly three of every four, not a coin's luck. `latency` puts first the candidate with the
lowest recent time to first token (an exponentially weighted average), except for an `explore`
share of requests that go to another candidate so a recovered provider is noticed; a candidate
never measured goes first, to be measured.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gateway.core.settings import Route, RoutingPolicy
from gateway.routing import sorting
from gateway.routing.sorting import Throughputs

# How much one new observation moves a candidate's average time to first token.
SMOOTHING = 0.3


@dataclass(slots=True)
class Spread:
    """Smooth weighted round robin per alias: each candidate's running credit."""

    credits: dict[str, dict[Route, float]] = field(default_factory=dict)

    def first(self, alias: str, routes: tuple[Route, ...]) -> Route:
        """The candidate whose turn it is."""
        credit = self.credits.setdefault(alias, {})
        if set(credit) != set(routes):  # the config changed what serves the alias
            credit.clear()
            credit.update({route: 0.0 for route in routes})
        total = sum(route.weight for route in routes)
        for route in routes:
            credit[route] += route.weight
        chosen = max(routes, key=lambda route: credit[route])
        credit[chosen] -= total
        return chosen

    def retain(self, aliases: Iterable[str]) -> None:
        """Forget aliases the config no longer has."""
        kept = set(aliases)
        self.credits = {a: c for a, c in self.credits.items() if a in kept}


@dataclass(slots=True)
class Latencies:
    """Recent time to first token per (provider, upstream model), in seconds."""

    averages: dict[tuple[str, str], float] = field(default_factory=dict)
    # Told of every new average, so a shared backend can spread it (`gateway.state.redis_sync`).
    listeners: list[Callable[[tuple[str, str], float], None]] = field(default_factory=list)

    def observe(self, provider: str, upstream_model: str, seconds: float) -> None:
        key = (provider, upstream_model)
        previous = self.averages.get(key)
        average = seconds if previous is None else previous + SMOOTHING * (seconds - previous)
        self.averages[key] = average
        for listener in self.listeners:
            listener(key, average)

    def learned(self, key: tuple[str, str], average: float) -> None:
        """Take in what another process measured."""
        self.averages[key] = average

    def of(self, route: Route) -> float | None:
        return self.averages.get((route.provider, route.upstream_model))

    def retain(self, routes: Iterable[Route]) -> None:
        """Forget what the config no longer routes to."""
        kept = {(r.provider, r.upstream_model) for r in routes}
        self.averages = {k: v for k, v in self.averages.items() if k in kept}


def ordered(alias: str, routes: tuple[Route, ...], policy: RoutingPolicy, spread: Spread,
            latencies: Latencies, rng: Callable[[], float] = random.random, *,
            throughputs: Throughputs | None = None, sort: str | None = None,
            cost: Callable[[Route], float | None] | None = None) -> tuple[Route, ...]:
    """The candidates in the order to try them: `sort`, a request's own (`x-llms-sort`), over
    the alias's strategy; `cost`, what this request costs at a route (for `price`; without it,
    file order)."""
    how = sort or policy.strategy
    if len(routes) < 2 or how == "order":
        return routes
    if how == "price":
        return routes if cost is None else sorting.by_price(routes, cost)
    if how == "throughput":
        return routes if throughputs is None else sorting.by_throughput(routes, throughputs)
    if how == "latency" and sort is not None:  # asked for: the fastest, no exploring
        return sorting.by_latency(routes, latencies.of)
    if how == "weighted":
        first = spread.first(alias, routes)
    else:
        first = _fastest(routes, policy.explore, latencies, rng)
    return (first, *(route for route in routes if route != first))


def _fastest(routes: tuple[Route, ...], explore: float, latencies: Latencies,
             rng: Callable[[], float]) -> Route:
    unmeasured = [route for route in routes if latencies.of(route) is None]
    if unmeasured:
        return unmeasured[0]
    best = min(routes, key=lambda route: latencies.of(route) or 0.0)
    if rng() < explore:
        others = [route for route in routes if route != best]
        return others[int(rng() * len(others)) % len(others)]
    return best
