"""Resume: a chat stream that breaks mid-answer is continued by a candidate, in the same stream.

Opt-in per alias (`"resume": true`, `"max_resumes"` in `models`). Below the bridges, on the
chat stream itself, so `/v1/messages` and `/v1/responses` streams and whole answers assembled
from streams (`gateway.adapters.assemble`) are resumed too. When the stream being read breaks
after its first event (a reset, an idle timeout, a malformed or an error event, a body that
ends unfinished) and no tool call has started, the alias's candidates are asked, in file order
from the one after the provider that broke and that provider last (so an alias with one
provider retries it), to continue the partial answer (`seam.continuation`); the first whose
stream opens is spliced in (`seam.Stitched`). Breakers and cooldowns order them as they do the
router's tries (`ProviderHealth.plan`): a candidate whose circuit is open or that is cooling
down is asked only after the others, and each continuation's outcome counts in its circuit.
A resume that finds no candidate, or one more break than `max_resumes` allows, ends the
stream with the break's error, as without resume.
A break before the first event is not this module's: the router fails over as always.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import contextmanager

import msgspec

from gateway.adapters.seam import Broke, Stitched, continuation
from gateway.core.errors import CircuitOpen
from gateway.core.settings import Route
from gateway.routing.health import Planned, ProviderHealth
from providers.contract.errors import (
    BadUpstreamResponse,
    ProviderError,
    ProviderUnavailable,
    UpstreamClientError,
)
from providers.contract.log import get_logger
from providers.contract.provider import Adapter, Outgoing, Provider, Resumes
from providers.contract.spec import CircuitPolicy
from providers.contract.stream import UNREADABLE_ANSWER, close_quietly, peek, unreadable
from providers.wire import sse

ENDPOINT = "chat/completions"


class Resuming(Adapter):
    """A chat provider whose broken streams, for aliases with `resume`, are continued by the
    alias's candidates (`providers`: every live provider, as kinds, by name; `health`: their
    breakers and cooldowns, the router's)."""

    kind = "resuming"

    def __init__(self, inner: Provider, resumes: Mapping[str, int],
                 routes: Mapping[str, tuple[Route, ...]], providers: Mapping[str, Provider],
                 health: ProviderHealth | None = None) -> None:
        super().__init__(inner)
        self.resumes = resumes  # alias -> max_resumes, for the aliases that resume
        self.routes = routes
        self.providers = providers
        self.health = health

    def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        most = self.resumes.get(request.model)
        if not most or request.endpoint != ENDPOINT or request.choices != 1:
            return self.inner.stream(request, upstream_model)  # untouched: no cost at all
        return self._resuming(request, upstream_model, most)

    async def _resuming(self, request: Outgoing, upstream_model: str, most: int
                        ) -> AsyncGenerator[bytes, None]:
        stitched = Stitched()
        chunks = self.inner.stream(request, upstream_model)
        spliced = False  # a continuation is being read
        while True:
            reason: str | None = None
            reader = _read(chunks, stitched)
            try:
                async for out in reader:
                    yield out
            except Broke as broke:
                if not stitched.passed:  # before its first event: the router's failover
                    raise (BadUpstreamResponse if broke.malformed
                           else ProviderUnavailable)(broke.reason) from None
                reason = broke.reason
            except ProviderError as exc:
                if not stitched.passed:
                    raise
                reason = f"{exc.reason}: {exc.message}"
            finally:
                await close_quietly(reader)
                await close_quietly(chunks)
            if reason is None or stitched.finished:  # whole (a break after its finish too)
                if spliced:
                    request.resumes.ok += 1
                if reason is not None and (tail := stitched.end()):
                    yield tail
                return
            _may_resume(stitched, reason, spliced, most, request.resumes)
            chunks = await self._continuation(request, stitched, reason)
            spliced = True

    async def _continuation(self, request: Outgoing, stitched: Stitched, reason: str
                            ) -> AsyncIterator[bytes]:
        """The first candidate's stream that opens asked to continue `stitched`; the break's
        error if none does."""
        partial = stitched.text
        log = get_logger()
        for provider, planned in self._order(request.model):
            dialect = provider.continues()
            body = continuation(request.json(), partial, dialect, stitched.tokens)
            asked = Outgoing(ENDPOINT, msgspec.json.encode(body), request.model, True,
                             request.request_id, request.client_wants_usage, request.key_id,
                             betas=request.betas, resumes=request.resumes,
                             priority=request.priority)
            try:
                with _accounted(self.health, provider, planned):
                    opened = await peek(provider.stream(asked, planned.route.upstream_model))
            except ProviderError as exc:
                log.info("resume_try_failed", request_id=request.request_id,
                         provider=provider.name, reason=exc.reason)
                continue
            except UNREADABLE_ANSWER as exc:  # its kind could not read what came
                log.info("resume_try_failed", request_id=request.request_id,
                         provider=provider.name, reason=unreadable(provider.name, exc).reason)
                continue
            except UpstreamClientError as exc:  # it refused the continuation (a prefill it
                log.info("resume_try_refused", request_id=request.request_id,  # cannot take)
                         provider=provider.name, status=exc.status)
                continue
            log.info("stream_resumed", request_id=request.request_id, broke=self.name,
                     provider=provider.name, dialect=dialect, reason=reason[:200],
                     sent_chars=len(partial))
            stitched.resumed(partial[len(partial.rstrip()):] if dialect == "prefill" else "")
            request.resumes.by = provider.name
            return _joined(opened.head, opened.rest)
        request.resumes.failed += 1
        raise ProviderUnavailable(f"{reason} (and no candidate could resume the stream)")

    def _order(self, alias: str) -> list[tuple[Provider, Planned]]:
        """The alias's candidates after this provider, then those before it, then itself;
        those whose circuit is open or that cool down after them (`ProviderHealth.plan`)."""
        routes = self.routes.get(alias, ())
        mine = [i for i, route in enumerate(routes) if route.provider == self.name]
        at = mine[0] if mine else len(routes)
        ordered = [*routes[at + 1:], *routes[:at], *routes[at:at + 1]]
        planned = self.health.plan(ordered, self._policy) if self.health is not None \
            else [Planned(route) for route in ordered]
        return [(provider, plan) for plan in planned
                if (provider := self.providers.get(plan.route.provider)) is not None
                and provider.supports(ENDPOINT)]

    def _policy(self, name: str) -> CircuitPolicy:
        provider = self.providers.get(name)
        return provider.spec.circuit if provider is not None else CircuitPolicy()


@contextmanager
def _accounted(health: ProviderHealth | None, provider: Provider, planned: Planned
               ) -> Iterator[None]:
    """A continuation try with its candidate's circuit claimed and its outcome recorded, as
    the router records a try: a provider's failure in its circuit, an answer (or a sensible
    refusal) as a success. A circuit that refuses the claim (its half-open probe is out) is
    a failed try here: there is no later turn to put it in."""
    if health is None:
        yield
        return
    policy = provider.spec.circuit
    claimed = health.acquire(planned, policy)
    if not claimed and not planned.forced:
        route = planned.route
        raise CircuitOpen(f"circuit open for {route.provider}/{route.upstream_model}")
    verdict = False
    try:
        yield
    except ProviderError as exc:
        verdict = exc.trips_circuit
        if verdict:
            health.failed(planned.route, policy, exc)
        raise
    except UpstreamClientError:
        verdict = True
        health.succeeded(planned, policy)
        raise
    finally:
        if claimed and not verdict:
            health.released(planned.route, policy)
    health.succeeded(planned, policy)


def _may_resume(stitched: Stitched, reason: str, spliced: bool, most: int,
                resumes: Resumes) -> None:
    """Raise the break's error when the stream may not be resumed (as without resume: the
    client gets it in-band); a continuation that broke is counted, ok if it may be resumed."""
    if stitched.tool_started or stitched.overflowed or stitched.resumes >= most:
        if spliced:
            resumes.failed += 1
        raise ProviderUnavailable(reason)
    if spliced:  # that continuation went on, and is resumed in turn
        resumes.ok += 1


async def _read(chunks: AsyncIterator[bytes], stitched: Stitched
                ) -> AsyncGenerator[bytes, None]:
    """One stream's events as the client gets them; `Broke` when it breaks, the stream's own
    `ProviderError` when it fails."""
    framer = sse.Framer()
    async for chunk in chunks:
        if complete := framer.feed(chunk):
            out, broke = stitched.take(complete)
            if out:
                yield out
            if broke is not None:
                raise broke
    if rest := framer.flush():
        out, broke = stitched.take(rest)
        if out:
            yield out
        if broke is not None:
            raise broke
    if not (stitched.done or stitched.finished):
        raise Broke("stream ended before it finished")
    if tail := stitched.end():
        yield tail


async def _joined(head: bytes, rest: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """A peeked stream read again from its start."""
    try:
        yield head
        async for chunk in rest:
            yield chunk
    finally:
        await close_quietly(rest)
