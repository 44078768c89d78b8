"""From a model alias to an answer: ordered candidates, retries per candidate, failover.

`candidates()` is pure: a config snapshot and a model in, the ordered routes out. `attempt()`
does the trying: each candidate gets `retries.attempts` tries (exponential backoff with jitter,
honouring `Retry-After` up to a cap) while its errors are retryable, then the next candidate.
A client's error (`UpstreamClientError`) ends the loop at once: another provider would say the same.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from gateway.config import Route, Snapshot
from gateway.health import Planned, ProviderHealth
from providers.contract.errors import (
    AllProvidersFailed,
    Attempt,
    CircuitOpen,
    ModelNotFound,
    ProviderError,
    UpstreamClientError,
)
from providers.contract.provider import Provider
from providers.contract.spec import CircuitPolicy, Retries

T = TypeVar("T")


def candidates(snapshot: Snapshot, model: str) -> tuple[Route, ...]:
    """The enabled providers serving `model`, in file order; ModelNotFound if none."""
    routes = snapshot.routes.get(model)
    if not routes:  # say who would serve it, had they not been disabled (an unset key, say)
        raise ModelNotFound(model, [(p.name, p.disabled_reason) for p in snapshot.providers
                                    if not p.enabled and model in p.models])
    return routes


def retry_delay(retries: Retries, tries_done: int, retry_after: float | None,
                jitter: Callable[[], float] = random.random) -> float:
    """Seconds to wait before try `tries_done + 1` at the same provider."""
    backoff = min(retries.max_backoff, retries.backoff * 2 ** (tries_done - 1))
    delay = backoff * (0.5 + jitter() / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, retries.retry_after_cap))
    return delay


@dataclass(frozen=True, slots=True)
class Served(Generic[T]):
    """A successful answer, with who served it and every failed try before it."""

    result: T
    provider: str
    failed: tuple[Attempt, ...]

    @property
    def attempts(self) -> int:
        return len(self.failed) + 1


Call = Callable[[Provider, str], Awaitable[T]]


async def attempt(model: str, routes: tuple[Route, ...], providers: Mapping[str, Provider],
                  call: Call[T], health: ProviderHealth | None = None) -> Served[T]:
    """Try the routes in order with per-candidate retries; AllProvidersFailed if none answers.

    With `health`, candidates whose circuit is open or who are cooling down are skipped, and
    every outcome is recorded there.
    """
    failed: list[Attempt] = []
    planned = health.plan(routes, lambda name: _policy(providers, name)) if health else [
        Planned(route) for route in routes]
    for plan in planned:
        provider = providers.get(plan.route.provider)
        if provider is None:
            continue
        try:
            result = await _with_retries(provider, plan, call, failed, health)
        except ProviderError:
            continue
        return Served(result, provider.name, tuple(failed))
    raise AllProvidersFailed(model, failed)


def _policy(providers: Mapping[str, Provider], name: str) -> CircuitPolicy:
    provider = providers.get(name)
    return provider.spec.circuit if provider is not None else CircuitPolicy()


def _with_retries(provider: Provider, plan: Planned, call: Call[T], failed: list[Attempt],
                  health: ProviderHealth | None) -> Awaitable[T]:
    """The tries at one candidate, to await; with one try (the default) that try itself,
    without a retry loop around it (a frame less to resume on every upstream read)."""
    retries = provider.spec.retries
    route, policy = plan.route, provider.spec.circuit

    async def once() -> T:
        if health is not None and not health.acquire(plan, policy):
            raise CircuitOpen(f"circuit open for {route.provider}/{route.upstream_model}")
        verdict = False
        try:
            result = await call(provider, route.upstream_model)
        except ProviderError as exc:
            if exc.retry_after is not None:  # every provider's hint is bounded here, once
                exc.retry_after = min(exc.retry_after, retries.max_retry_after)
            verdict = exc.trips_circuit  # otherwise the claim is only released (finally)
            failed.append(Attempt(provider.name, exc.upstream_status, exc.reason, exc.message,
                                  exc.retry_after))
            if health is not None and verdict and not isinstance(exc, CircuitOpen):
                health.failed(route, policy, exc)
            raise
        except UpstreamClientError:
            verdict = True  # the provider answered sensibly: it is healthy
            if health is not None:
                health.succeeded(route, policy)
            raise
        finally:
            if health is not None and not verdict:
                health.released(route, policy)
        if health is not None:
            health.succeeded(route, policy)
        return result

    if retries.attempts <= 1:
        return once()
    return _retrying(once, retries)


async def _retrying(once: Callable[[], Awaitable[T]], retries: Retries) -> T:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hint = exc.retry_after if isinstance(exc, ProviderError) else None
        return retry_delay(retries, state.attempt_number, hint)

    retrying = AsyncRetrying(
        stop=stop_after_attempt(retries.attempts),
        wait=wait,
        retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
        reraise=True,
    )
    async for try_ in retrying:
        with try_:
            return await once()
    raise AssertionError("unreachable: tenacity re-raises the last error")
