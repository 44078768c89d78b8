"""From a model alias to an answer: ordered candidates, retries per candidate, failover, hedging.

`candidates()` is pure: a config snapshot and a model in, the ordered routes out. `attempt()`
does the trying, through the one failover loop (`providers.contract.failover`): each
candidate gets `retries.attempts` tries (exponential backoff with jitter, honouring
`Retry-After` up to a cap) while its errors are retryable, then the next candidate. A client's
error (`UpstreamClientError`) ends the loop at once: another provider would say the same. A
model's limit is not the client's error: after a "too long", only candidates with a larger
known window are tried; after a content policy's refusal, none serving the same model.

A try returns once its first token is there (`providers.contract.provider.Answer`), so a hedge
races on the tries' return values alone. How long to wait before hedging, and whether the
alias's budget allows one more hedge, is `gateway.routing.hedging`'s to say; a candidate
excluded by its circuit or a cooldown is never hedged into, only failed over to. A whole
answer still gathering is then read to its end within the same candidate's turn: a break
before the end is a failover too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any

import msgspec
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from gateway.core.errors import AllProvidersFailed, Attempt, CircuitOpen, ModelNotFound
from gateway.core.settings import Route, Snapshot
from gateway.routing.health import Planned, ProviderHealth
from gateway.routing.hedging import AliasHedging
from gateway.routing.strategy import Latencies
from gateway.routing.verdicts import judged
from providers.contract.errors import (
    ContentRefused,
    ContextLengthExceeded,
    ProviderError,
    UpstreamClientError,
)
from providers.contract.failover import NoneAnswered, first_answer
from providers.contract.provider import Answer, Gathering, Outgoing, Provider, Reply
from providers.contract.spec import CircuitPolicy, Retries
from providers.contract.stream import UNREADABLE_ANSWER, Opened, unreadable
from providers.contract.usage import Usage


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
    backoff = min(retries.max_backoff, retries.backoff * 2.0 ** (tries_done - 1))
    delay = backoff * (0.5 + jitter() / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, retries.retry_after_cap))
    return delay


# Structs, not frozen dataclasses: made for every request, and a frozen dataclass's __init__
# sets each field through object.__setattr__.
class Routing(msgspec.Struct, frozen=True):
    """What trying candidates uses beside them: circuit and cooldown state, the latencies the
    latency strategy learns from, and the alias's hedging (None: no hedging)."""

    health: ProviderHealth | None = None
    latencies: Latencies | None = None
    hedging: AliasHedging | None = None


UNWATCHED = Routing()  # no health, no latencies, no hedging


class Served(msgspec.Struct, frozen=True):
    """A successful answer, who served it, and every failed try before it."""

    answer: Answer
    provider: str
    failed: tuple[Attempt, ...]
    upstream_time: float  # the answering try's time, to its first token or its whole answer
    hedged: bool = False  # a second candidate was started beside the first
    hedge_won: bool = False  # and answered first
    lost: tuple[Lost, ...] = ()  # tries cancelled by a hedge race, billed all the same

    @property
    def attempts(self) -> int:
        return len(self.failed) + 1


class Lost(msgspec.Struct, frozen=True):
    """A try that lost a hedge race after it was sent: a provider bills a request it was
    sent (its prompt, at least) whether or not its answer is read; `usage` when it came."""

    provider: str
    usage: Usage | None = None


class _Candidate(msgspec.Struct, frozen=True):
    provider: Provider
    plan: Planned


class _Won(msgspec.Struct, frozen=True):
    answer: Answer
    candidate: _Candidate
    took: float


class _Trying:
    """One request's turn through its candidates: what was tried, what failed."""

    def __init__(self, request: Outgoing, candidates: list[_Candidate], routing: Routing
                 ) -> None:
        self.request = request
        self.candidates = candidates
        self.routing = routing
        self.failed: list[Attempt] = []
        # A list: a Route hashes all its fields in Python, and it is looked in only when a
        # circuit refuses a try.
        self.tried: list[Route] = []
        self.at = 0
        self.hedged = self.hedge_won = False
        self.lost: list[Lost] = []
        # What failures taught about the candidates left: the largest window that was too
        # small (a known one), and the upstream models whose content policy refused.
        self.overflowed: int | None = None
        self.refused: ContentRefused | None = None
        self.refusing: set[str] = set()

    def pick(self) -> int | None:
        """The next candidate to try; one that cannot do better than a failed one (a window
        no larger than one that overflowed, a model that refused) is skipped and listed."""
        while self.at < len(self.candidates):
            route = self.candidates[self.at].plan.route
            why = self._hopeless(route)
            if why is None:
                return self.at
            self.failed.append(Attempt(route.provider, None, why[0], why[1]))
            self.at += 1
        return None

    def _hopeless(self, route: Route) -> tuple[str, str] | None:
        if route.upstream_model in self.refusing:
            return ("content_policy", f"skipped: {route.upstream_model} refused this request")
        if (self.overflowed is not None and route.context_window is not None
                and route.context_window <= self.overflowed):
            return ("context_too_small", f"skipped: {route.upstream_model} holds "
                    f"{route.context_window}, no more than a window that overflowed")
        return None

    def _learn(self, route: Route, exc: ProviderError) -> None:
        """A model limit tells which candidates left cannot answer either."""
        if isinstance(exc, ContentRefused):
            self.refused = exc
            self.refusing.add(route.upstream_model)
        elif isinstance(exc, ContextLengthExceeded) and route.context_window is not None:
            self.overflowed = max(self.overflowed or 0, route.context_window)

    def turn(self, at: int) -> Coroutine[Any, Any, _Won]:
        """The candidate at `at`, raced against the next one when hedging; its answer whole
        when the client asked for it whole (to await: no frame of its own to resume)."""
        hedging = self.routing.hedging
        self.at += 1
        # An excluded candidate (circuit open, cooling down) is never hedged into: a hedge
        # doubles the load on it; it waits until the others have failed.
        if hedging is None or at + 1 >= len(self.candidates) \
                or self.candidates[at + 1].plan.forced:
            return self._tries(self.candidates[at], gather=True)
        return self._hedged(self.candidates[at], self.candidates[at + 1], hedging)

    async def _hedged(self, first: _Candidate, second: _Candidate, hedging: AliasHedging
                      ) -> _Won:
        return await self._gathered(await self._race(
            first, second, hedging, hedging.delay(first.plan.route.provider)))

    async def _race(self, first: _Candidate, second: _Candidate, hedging: AliasHedging,
                    after: float) -> _Won:
        """`first`, and `second` too if `first` has not answered after `after` seconds and
        a hedge may start: the first answer wins and the other try is cancelled (its upstream
        request closed)."""
        started = time.perf_counter()
        leader = asyncio.create_task(self._tries(first, gather=False))
        tasks = {leader}
        hedge: asyncio.Task[_Won] | None = None
        winner: asyncio.Task[_Won] | None = None
        try:
            done, _ = await asyncio.wait(tasks, timeout=after)
            if done or not self._may_hedge(second, hedging):
                winner = leader
                return await leader
            self.at += 1  # the second candidate has its turn now, beside the first
            self.hedged = True
            tasks.add(hedge := asyncio.create_task(self._tries(second, gather=False)))
            winner = await _first_success(tasks)
            self.hedge_won = winner is not leader
            if not leader.done():  # slow, not failed: how slow, at least, for the quantile
                hedging.observe(first.plan.route.provider, time.perf_counter() - started)
            return winner.result()
        finally:  # cancelled itself (the client left), or a winner chosen: nothing else runs on
            for task, candidate in ((leader, first), (hedge, second)):
                if task is not None and task is not winner \
                        and (lost := await _cancel(task, candidate.provider.name)):
                    self.lost.append(lost)

    def _may_hedge(self, second: _Candidate, hedging: AliasHedging) -> bool:
        """Whether the hedge may start now: not into a candidate whose circuit opened or whose
        provider began cooling down since the plan (another request's failure), and only
        within the alias's budget (spent here, so asked last)."""
        health = self.routing.health
        if health is not None and health.blocked_until(
                second.plan.route, second.provider.spec.circuit, health.clock()):
            return False
        return hedging.spend()

    async def _gathered(self, won: _Won) -> _Won:
        if self.request.stream or not isinstance(won.answer, Gathering):
            return won
        return await self._accounted(won.candidate, lambda: self._gather(won))

    async def _gather(self, won: _Won) -> _Won:
        started = time.perf_counter()
        assert isinstance(won.answer, Gathering)
        reply = await won.answer.reply()
        return _Won(reply, won.candidate, won.took + time.perf_counter() - started)

    def _tries(self, candidate: _Candidate, gather: bool) -> Coroutine[Any, Any, _Won]:
        """The tries at one candidate, to await; with one try (the default) that try itself,
        without a retry loop around it (a frame less to resume on every upstream read)."""
        def once() -> Coroutine[Any, Any, _Won]:
            return self._accounted(candidate, lambda: self._try(candidate), gather)

        retries = candidate.provider.spec.retries
        return once() if retries.attempts <= 1 else _retrying(once, retries)

    async def _try(self, candidate: _Candidate) -> _Won:
        provider, route = candidate.provider, candidate.plan.route
        started = time.perf_counter()
        try:
            answer = await provider.answer(self.request, route.upstream_model)
        except UNREADABLE_ANSWER as exc:  # a kind could not read what came: the upstream's
            raise unreadable(provider.name, exc) from None
        took = time.perf_counter() - started
        if self.routing.latencies is not None:  # to the first token (a whole reply's end)
            self.routing.latencies.observe(provider.name, route.upstream_model, took)
        if self.routing.hedging is not None:
            self.routing.hedging.observe(provider.name, took)
        return _Won(answer, candidate, took)

    async def _accounted(self, candidate: _Candidate, run: Callable[[], Awaitable[_Won]],
                         gather: bool = False) -> _Won:
        """`run` with the candidate's circuit claimed and its outcome recorded: a failure in
        `failed` and in its circuit, a success in its circuit. A candidate refused before its
        first try (another request holds the half-open probe) is tried again, forced, after
        the others: skipped, it could still be the one to answer. With `gather`, a whole
        answer still gathering is then read to its end, accounted in turn."""
        health, plan = self.routing.health, candidate.plan
        provider, route, policy = candidate.provider, plan.route, candidate.provider.spec.circuit
        retries = provider.spec.retries
        claim = health.acquire(plan, policy) if health is not None else None
        if health is not None and claim is None and not plan.forced:
            if route not in self.tried:
                self.candidates.append(_Candidate(provider, plan._replace(forced=True)))
            raise CircuitOpen(f"circuit open for {route.provider}/{route.upstream_model}")
        self.tried.append(route)
        verdict = False
        try:
            won = await run()
            verdict = True  # given below: now, or by a stream when it ends
        except ProviderError as exc:
            if exc.retry_after is not None:  # every provider's hint is bounded here, once
                exc.retry_after = min(exc.retry_after, retries.max_retry_after)
            verdict = exc.trips_circuit  # otherwise the claim is only released (finally)
            self.failed.append(Attempt(provider.name, exc.upstream_status, exc.reason,
                                       exc.message, exc.retry_after))
            self._learn(route, exc)
            if health is not None and verdict and not isinstance(exc, CircuitOpen):
                health.failed(route, policy, exc, claim)
            raise
        except UpstreamClientError:
            verdict = True  # the provider answered sensibly: it is healthy
            if health is not None:
                health.succeeded(plan, policy)
            raise
        finally:
            if health is not None and claim is not None and not verdict:
                health.released(route, policy, claim)
        if health is not None and isinstance(won.answer, Opened) and policy.enabled:
            # A break mid-stream is a failure too: the verdict waits for the stream's end.
            judged(won.answer, health, plan, policy, claim, self.request.resumes)
        elif health is not None:
            health.succeeded(plan, policy)
        return await self._gathered(won) if gather else won


async def attempt(model: str, routes: tuple[Route, ...], providers: Mapping[str, Provider],
                  request: Outgoing, routing: Routing = UNWATCHED) -> Served:
    """Try the routes in order with per-candidate retries; AllProvidersFailed if none answers.

    With `routing.health`, candidates whose circuit is open or who are cooling down go last,
    tried only once the others failed (`ProviderHealth.plan`), and every outcome is recorded
    there. With `routing.hedging`, a candidate slow to its first token gets the next one
    started beside it, within the alias's budget: never more than two tries in flight.
    """
    health = routing.health
    if routing.hedging is not None:
        routing.hedging.requested()
    # A partial, not a lambda: no frame of its own around `_policy` for each candidate.
    planned = health.plan(routes, functools.partial(_policy, providers)) if health else [
        Planned(route) for route in routes]
    trying = _Trying(request, [_Candidate(p, plan) for plan in planned
                               if (p := providers.get(plan.route.provider)) is not None],
                     routing)
    try:
        won = await first_answer(trying.pick, trying.turn)
    except NoneAnswered:
        failed = AllProvidersFailed(model, trying.failed)
        failed.refused = trying.refused.relayed if trying.refused is not None else None
        raise failed from None
    return Served(won.answer, won.candidate.provider.name, tuple(trying.failed), won.took,
                  trying.hedged, trying.hedge_won, tuple(trying.lost))


async def _first_success(tasks: set[asyncio.Task[_Won]]) -> asyncio.Task[_Won]:
    """The first of `tasks` to answer; one that failed drops out of the race (the last one
    left is returned, failed or not)."""
    racing = set(tasks)
    while True:
        done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        for task in _in_order(tasks, done):
            if task.exception() is None:
                return task
            if len(racing) == 1:
                return task  # the last one standing: its error is the race's
            racing.discard(task)


def _in_order(tasks: set[asyncio.Task[_Won]], done: set[asyncio.Task[_Won]]
              ) -> Iterator[asyncio.Task[_Won]]:
    yield from (t for t in tasks if t in done)


async def _cancel(task: asyncio.Task[_Won], provider: str) -> Lost | None:
    """Stop a try that lost; an answer it already had is closed (its upstream request too).
    What its provider bills for it, unless it failed (a failure is not billed)."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ProviderError):
            await task
        return Lost(provider) if task.cancelled() else None
    if task.cancelled() or task.exception() is not None:
        return None
    answer = task.result().answer
    await answer.close()
    return Lost(provider, answer.usage if isinstance(answer, Reply) else None)


def _policy(providers: Mapping[str, Provider], name: str) -> CircuitPolicy:
    provider = providers.get(name)
    return provider.spec.circuit if provider is not None else CircuitPolicy()


async def _retrying(once: Callable[[], Awaitable[_Won]], retries: Retries) -> _Won:
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
