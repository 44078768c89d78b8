"""What the gateway remembers about providers between requests: breakers and cooldowns.

`ProviderHealth` lives on the `Runtime` (so it survives config reloads) and is consulted by the
router. A breaker saves time on a provider that is down; it never refuses a request another try
could answer. So `plan()` excludes no candidate, it only orders them:

1. the candidates that may be tried now, in the strategy's order;
2. then the excluded ones (circuit open, half-open with its probe out, or cooling down after a
   429), the soonest to recover first: tried, `forced`, only once every candidate before them
   has failed. With every candidate excluded, that is the whole plan (Envoy's panic routing).

A forced try that succeeds ends the exclusion at once (its circuit closes, its cooldown ends);
one that fails counts as a failed probe. Every trip and cooldown is also offered to `listeners`,
which is how a shared backend (Redis) spreads them to other processes;
`apply_remote()` takes theirs in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gateway.core.settings import Route
from gateway.routing.circuit import Breaker, CircuitState, Claim
from providers.contract.errors import ProviderError, ProviderRateLimited
from providers.contract.spec import CircuitPolicy


@dataclass(frozen=True, slots=True)
class Change:
    """A trip or a cooldown, as shared with other gateway processes."""

    provider: str
    model: str | None  # None: the cooldown is for the whole provider
    until: float
    trips: int = 0


class Planned(NamedTuple):
    """A candidate to try; `forced` when it is excluded (open, cooling down) and tried only
    because every candidate before it failed."""

    route: Route
    forced: bool = False


class ProviderHealth:
    """Breakers per (provider, upstream model) and rate-limit cooldowns per provider."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.breakers: dict[tuple[str, str], Breaker] = {}
        self.cooldowns: dict[str, float] = {}
        self.listeners: list[Callable[[Change], None]] = []
        # The (provider, upstream model) pairs the live config routes to (None: any).
        self._routed: frozenset[tuple[str, str]] | None = None

    def retain(self, routes: Iterable[Route]) -> None:
        """Forget breakers and cooldowns of what a reload removed (a provider, or a model a
        `"models": "*"` listing no longer has): state follows the config, and `/ready` and
        `/metrics` stop reporting what is gone."""
        routed = frozenset((r.provider, r.upstream_model) for r in routes)
        self._routed = routed
        providers = {provider for provider, _ in routed}
        self.breakers = {key: b for key, b in self.breakers.items() if key in routed}
        self.cooldowns = {p: until for p, until in self.cooldowns.items() if p in providers}

    def breaker(self, route: Route, policy: CircuitPolicy) -> Breaker:
        key = (route.provider, route.upstream_model)
        found = self.breakers.get(key)
        if found is None:
            found = self.breakers[key] = Breaker(policy)
        elif found.policy is not policy:
            found.policy = policy  # a reload changed the thresholds; keep the history
        return found

    def blocked_until(self, route: Route, policy: CircuitPolicy, now: float) -> float:
        """0 if the route may be tried now, else when it may."""
        if not policy.enabled:
            return 0.0
        until = self.breaker(route, policy).blocked_until(now)
        cooling = self.cooldowns.get(route.provider, 0.0)
        return cooling if cooling > now and cooling > until else until  # no max() to call

    def plan(self, routes: Sequence[Route], policies: Callable[[str], CircuitPolicy],
             now: float | None = None) -> list[Planned]:
        """Every route, in the order to try: those ready now in `routes`' order, then the
        excluded ones, forced, the soonest to recover first (ties in `routes`' order)."""
        now = self.clock() if now is None else now
        ready: list[Planned] = []
        excluded: list[tuple[float, int, Route]] = []
        for at, route in enumerate(routes):  # once per request: a plain loop
            until = self.blocked_until(route, policies(route.provider), now)
            if not until:
                ready.append(Planned(route))
            else:
                excluded.append((until, at, route))
        if excluded:
            excluded.sort(key=lambda row: row[:2])
            ready += [Planned(route, forced=True) for _, _, route in excluded]
        return ready

    def acquire(self, planned: Planned, policy: CircuitPolicy) -> Claim | None:
        """Claim a try at the route's circuit (half-open lets one probe through); None when
        refused. A forced try then goes without a claim: it has no probe of its own to free."""
        return self.breaker(planned.route, policy).acquire(self.clock())

    def succeeded(self, planned: Planned, policy: CircuitPolicy) -> None:
        """Close the route's circuit; a forced try that answered also ends its provider's
        cooldown (it was tried during it, so the provider is taking requests again)."""
        self.breaker(planned.route, policy).success(self.clock())
        if planned.forced:
            self.cooldowns.pop(planned.route.provider, None)

    def failed(self, route: Route, policy: CircuitPolicy, error: ProviderError,
               claim: Claim | None = None) -> None:
        """Count a failure; a 429 cools the whole provider down instead, and frees the probe
        `claim` holds, if any (never another request's)."""
        if not policy.enabled:
            return
        now = self.clock()
        if isinstance(error, ProviderRateLimited):
            until = now + (error.retry_after or policy.rate_limit_cooldown)
            if until > self.cooldowns.get(route.provider, 0.0):
                self.cooldowns[route.provider] = until
                self._announce(Change(route.provider, None, until))
            if claim is not None:
                self.breaker(route, policy).release(claim)
            return
        breaker = self.breaker(route, policy)
        if breaker.failure(now):
            self._announce(Change(route.provider, route.upstream_model, breaker.open_until,
                                  breaker.trips))

    def released(self, route: Route, policy: CircuitPolicy, claim: Claim) -> None:
        """The claimed try ended without a verdict: its probe, if it was one, is free."""
        self.breaker(route, policy).release(claim)

    def apply_remote(self, change: Change, policy: CircuitPolicy | None = None) -> None:
        """Take in a trip or cooldown another process saw."""
        now = self.clock()
        if change.until <= now:
            return
        if change.model is None:
            if change.until > self.cooldowns.get(change.provider, 0.0):
                self.cooldowns[change.provider] = change.until
            return
        key = (change.provider, change.model)
        if self._routed is not None and key not in self._routed:
            return  # another replica's config routes there; this one does not
        breaker = self.breakers.get(key)
        if breaker is None:
            breaker = self.breakers[key] = Breaker(policy or CircuitPolicy())
        if breaker.state is not CircuitState.OPEN or breaker.open_until < change.until:
            breaker.state = CircuitState.OPEN
            breaker.open_until = change.until
            breaker.trips = max(breaker.trips, change.trips)
            breaker.probe = 0

    def snapshot(self) -> list[dict[str, object]]:
        """Every breaker and cooldown, for /ready, metrics and the status page."""
        now = self.clock()
        rows: list[dict[str, object]] = [
            {"provider": p, "model": m, "state": b.state.value, "trips": b.trips,
             "open_for": round(max(0.0, b.open_until - now), 3)}
            for (p, m), b in self.breakers.items()
        ]
        rows += [{"provider": p, "model": None, "state": "cooling_down",
                  "open_for": round(until - now, 3)}
                 for p, until in self.cooldowns.items() if until > now]
        return rows

    def _announce(self, change: Change) -> None:
        for listener in self.listeners:
            listener(change)
