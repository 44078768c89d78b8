"""From a model alias to an answer: ordered candidates, retries per candidate, failover.

`candidates()` is pure: a config snapshot and a model in, the ordered routes out. `attempt()`
does the trying: each candidate gets `retries.attempts` tries (exponential backoff with jitter,
honouring `Retry-After` up to a cap) while its errors are retryable, then the next candidate.
A client's error (`UpstreamClientError`) ends the loop at once: another provider would say the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
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
    hedged: bool = False  # a second candidate was started beside the first

    @property
    def attempts(self) -> int:
        return len(self.failed) + 1


# Set by a try when its first token arrives (`first_token`): a hedged race is decided by it.
_FIRST_TOKEN: ContextVar[asyncio.Event | None] = ContextVar("first_token", default=None)


def first_token() -> None:
    """Called by a try once its first token has arrived (a no-op unless it is racing)."""
    if (event := _FIRST_TOKEN.get()) is not None:
        event.set()


@dataclass(frozen=True, slots=True)
class Hedging(Generic[T]):
    """`routing.hedge_after`: seconds without a first token before the next candidate starts
    too; `discard` closes a result that lost the race, `told` hears "started" and "won"."""

    after: float
    discard: Callable[[T], Awaitable[None]]
    told: Callable[[str], None] = lambda _: None


Call = Callable[[Provider, str], Awaitable[T]]


async def attempt(model: str, routes: tuple[Route, ...], providers: Mapping[str, Provider],
                  call: Call[T], health: ProviderHealth | None = None,
                  hedging: Hedging[T] | None = None) -> Served[T]:
    """Try the routes in order with per-candidate retries; AllProvidersFailed if none answers.

    With `health`, candidates whose circuit is open or who are cooling down are skipped, and
    every outcome is recorded there. With `hedging`, a candidate slow to its first token gets
    the next one started beside it (`_race`): never more than two tries in flight.
    """
    failed: list[Attempt] = []
    planned = health.plan(routes, lambda name: _policy(providers, name)) if health else [
        Planned(route) for route in routes]
    candidates = [(p, plan) for plan in planned
                  if (p := providers.get(plan.route.provider)) is not None]
    at = 0
    while at < len(candidates):
        provider, plan = candidates[at]
        if hedging is not None and at + 1 < len(candidates):
            served, hedged = await _race(candidates[at], candidates[at + 1], call, failed,
                                         health, hedging)
            at += 2 if hedged else 1
            if served is not None:
                return Served(served.result, served.provider, tuple(failed), hedged)
            continue
        at += 1
        try:
            result = await _with_retries(provider, plan, call, failed, health)
        except ProviderError:
            continue
        return Served(result, provider.name, tuple(failed))
    raise AllProvidersFailed(model, failed)


Candidate = tuple[Provider, Planned]


async def _race(first: Candidate, second: Candidate, call: Call[T], failed: list[Attempt],
                health: ProviderHealth | None, hedging: Hedging[T]
                ) -> tuple[Served[T] | None, bool]:
    """`first`, and `second` too if `first` has no token after `hedging.after`: the first to
    produce a token wins and the other is cancelled at once. The answer (None if the tries
    failed), and whether `second` was started."""
    tokens: dict[asyncio.Task[T], asyncio.Event] = {}
    names: dict[asyncio.Task[T], str] = {}

    def start(candidate: Candidate) -> asyncio.Task[T]:
        provider, plan = candidate
        event = asyncio.Event()

        async def run() -> T:
            _FIRST_TOKEN.set(event)  # this task's own context: only its try sees it
            return await _with_retries(provider, plan, call, failed, health)

        task = asyncio.create_task(run())
        tokens[task], names[task] = event, provider.name
        return task

    leader = start(first)
    kept: asyncio.Task[T] | None = None  # the winner: not to be cancelled on the way out
    try:
        if not await _token_or_end(leader, tokens[leader], hedging.after):
            hedging.told("started")
            hedge = start(second)
            kept = await _first_with_token(tokens)
            for task in tokens:
                if task is not kept:
                    await _cancel(task, hedging)
            if kept is hedge:
                hedging.told("won")
            try:
                return Served(await kept, names[kept], (), hedged=True), True
            except ProviderError:
                return None, True
        kept = leader
        try:
            return Served(await leader, names[leader], ()), False
        except ProviderError:
            return None, False
    finally:  # cancelled itself (the client left), or a winner chosen: nothing else runs on
        for task in tokens:
            if task is not kept or not task.done():
                await _cancel(task, hedging)


async def _token_or_end(task: asyncio.Task[T], token: asyncio.Event, within: float) -> bool:
    """Whether `task` produced its first token (or ended) within `within` seconds."""
    waiter = asyncio.ensure_future(token.wait())
    try:
        await asyncio.wait({task, waiter}, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    return task.done() or token.is_set()


async def _first_with_token(tokens: Mapping[asyncio.Task[T], asyncio.Event]) -> asyncio.Task[T]:
    """The task whose token came first; one that failed drops out of the race (the last one
    left wins by default)."""
    racing = dict(tokens)
    while True:
        for task, token in racing.items():
            if token.is_set() or (task.done() and not task.cancelled()
                                  and task.exception() is None):
                return task
        waiters = {asyncio.ensure_future(t.wait()) for t in racing.values()}
        try:
            await asyncio.wait({*racing, *waiters}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        for task in [t for t in racing if t.done() and t.exception() is not None]:
            if len(racing) == 1:
                return task  # the last one standing: its error is the race's
            del racing[task]


async def _cancel(task: asyncio.Task[T], hedging: Hedging[T]) -> None:
    """Stop a try that lost; a result it already had is closed (its upstream request too)."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ProviderError):
            await task
        return
    if not task.cancelled() and task.exception() is None:
        await hedging.discard(task.result())


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
