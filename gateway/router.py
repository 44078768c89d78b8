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

from gateway.config import Retries, Route, Snapshot
from gateway.errors import AllProvidersFailed, Attempt, ModelNotFound, ProviderError
from providers.base import Provider

T = TypeVar("T")


def candidates(snapshot: Snapshot, model: str) -> tuple[Route, ...]:
    """The enabled providers serving `model`, in file order; ModelNotFound if none."""
    routes = snapshot.routes.get(model)
    if not routes:
        raise ModelNotFound(model)
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
                  call: Call[T]) -> Served[T]:
    """Try the routes in order with per-candidate retries; AllProvidersFailed if none answers."""
    failed: list[Attempt] = []
    for route in routes:
        provider = providers.get(route.provider)
        if provider is None:
            continue
        try:
            result = await _with_retries(provider, route.upstream_model, call, failed)
        except ProviderError:
            continue
        return Served(result, provider.name, tuple(failed))
    raise AllProvidersFailed(model, failed)


async def _with_retries(provider: Provider, upstream_model: str, call: Call[T],
                        failed: list[Attempt]) -> T:
    retries = provider.spec.retries

    def record(exc: ProviderError) -> None:
        failed.append(Attempt(provider.name, exc.upstream_status, exc.reason, exc.message,
                              exc.retry_after))

    if retries.attempts <= 1:  # the common case needs no retry machinery
        try:
            return await call(provider, upstream_model)
        except ProviderError as exc:
            record(exc)
            raise

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
            try:
                return await call(provider, upstream_model)
            except ProviderError as exc:
                record(exc)
                raise
    raise AssertionError("unreachable: tenacity re-raises the last error")
