"""Resume: a chat stream that breaks mid-answer is continued by a candidate, in the same stream.

Opt-in per alias (`"resume": true`, `"max_resumes"` in `models`). Below the bridges, on the
chat stream itself, so `/v1/messages` and `/v1/responses` streams and whole answers assembled
from streams (`gateway.adapters.assemble`) are resumed too. When the stream being read breaks
after its first event (a reset, an idle timeout, a malformed or an error event, a body that
ends unfinished) and no tool call has started, the alias's candidates are asked, in file order
from the one after the provider that broke and that provider last (so an alias with one
provider retries it), to continue the partial answer (`seam.continuation`); the first whose
stream opens is spliced in (`seam.Stitched`). The candidates are tried by the router's one
failover loop (`gateway.routing.router.attempt`), so breakers and cooldowns order them as they
order any request's: a candidate whose circuit is open or that is cooling down is asked only
after the others, and each continuation's outcome counts in its circuit.
A resume that finds no candidate, or one more break than `max_resumes` allows, ends the
stream with the break's error, as without resume.
Every continuation is billed by its provider in full (the prompt again, the partial answer,
its new output), while the client is shown the usage of one answer: what it costs beyond that
is added to the request's charge (`Resumes.billed`), at the continuing provider's price.
A break before the first event is not this module's: the router fails over as always.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import msgspec

from gateway.adapters.seam import Broke, Stitched, continuation
from gateway.core.errors import AllProvidersFailed
from gateway.core.settings import Route
from gateway.routing import router
from gateway.routing.health import ProviderHealth
from providers.contract.errors import (
    BadUpstreamResponse,
    ModelLimit,
    ProviderError,
    ProviderUnavailable,
    UpstreamClientError,
)
from providers.contract.log import get_logger
from providers.contract.provider import Adapter, Answer, Outgoing, Provider, Resumes
from providers.contract.stream import Opened, close_quietly
from providers.contract.usage import Price, Usage, cost
from providers.wire import sse

ENDPOINT = "chat/completions"


class Resuming(Adapter):
    """A chat provider whose broken streams, for aliases with `resume`, are continued by the
    alias's candidates (`providers`: every live provider, as kinds, by name; `health`: their
    breakers and cooldowns, the router's; `prices`: per (provider, alias), what continuations
    are charged at)."""

    kind = "resuming"

    def __init__(self, inner: Provider, resumes: Mapping[str, int],
                 routes: Mapping[str, tuple[Route, ...]], providers: Mapping[str, Provider],
                 health: ProviderHealth | None = None,
                 prices: Mapping[tuple[str, str], Price] = MappingProxyType({})) -> None:
        super().__init__(inner)
        self.resumes = resumes  # alias -> max_resumes, for the aliases that resume
        self.routes = routes
        self.providers = providers
        self.health = health
        self.prices = prices

    def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        most = self.resumes.get(request.model)
        if not most or request.endpoint != ENDPOINT or request.choices != 1:
            return self.inner.stream(request, upstream_model)  # untouched: no cost at all
        return self._resuming(request, upstream_model, most)

    async def _resuming(self, request: Outgoing, upstream_model: str, most: int
                        ) -> AsyncGenerator[bytes, None]:
        stitched = Stitched()
        chunks = self.inner.stream(request, upstream_model)
        spliced: _Continued | None = None  # the continuation being read
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
                if spliced is not None:  # read to its end, broken, or left by the client
                    request.resumes.billed += self._billed(request.model, spliced, stitched)
            if reason is None or stitched.finished:  # whole (a break after its finish too)
                if spliced:
                    request.resumes.ok += 1
                if reason is not None and (tail := stitched.end()):
                    yield tail
                return
            _may_resume(stitched, reason, spliced is not None, most, request.resumes)
            chunks, spliced = await self._continuation(request, stitched, reason)

    def _billed(self, alias: str, continued: _Continued, stitched: Stitched) -> float:
        """What a continuation costs beyond the answer's usage the client is shown (which
        counts its output, at this provider's price): its whole usage at its provider's
        price, as its usage said or else estimated, less that output here."""
        output = stitched.own_usage.completion_tokens if stitched.own_usage is not None \
            else stitched.continued_tokens
        usage = stitched.own_usage or Usage(prompt_tokens=continued.prompt,
                                            completion_tokens=output)
        theirs = self.prices.get((continued.provider, alias))
        mine = self.prices.get((self.name, alias))
        return (cost(usage, theirs) if theirs is not None else 0.0) \
            - (cost(Usage(completion_tokens=output), mine) if mine is not None else 0.0)

    async def _continuation(self, request: Outgoing, stitched: Stitched, reason: str
                            ) -> tuple[AsyncIterator[bytes], _Continued]:
        """The first candidate's stream that opens asked to continue `stitched`, tried by the
        router's one failover loop (its ordering by breakers and cooldowns, its circuit
        accounting); the break's error if none does."""
        partial = stitched.text
        log = get_logger()
        continuing = {name: _Continuing(provider, partial, stitched.tokens)
                      for name, provider in self.providers.items()
                      if provider.supports(ENDPOINT)}
        asked = Outgoing(ENDPOINT, request.raw, request.model, True, request.request_id,
                         request.client_wants_usage, request.key_id, betas=request.betas,
                         resumes=request.resumes, priority=request.priority)
        try:
            served = await router.attempt(request.model, self._order(request.model),
                                          continuing, asked, router.Routing(self.health))
        except AllProvidersFailed as exc:
            for tried in exc.attempts:
                log.info("resume_try_failed", request_id=request.request_id,
                         provider=tried.provider, reason=tried.reason, status=tried.status)
            request.resumes.failed += 1
            raise ProviderUnavailable(f"{reason} (and no candidate could resume the "
                                      "stream)") from None
        opened = served.answer
        assert isinstance(opened, Opened), "a continuation is asked as a stream"
        dialect = continuing[served.provider].inner.continues()
        log.info("stream_resumed", request_id=request.request_id, broke=self.name,
                 provider=served.provider, dialect=dialect, reason=reason[:200],
                 sent_chars=len(partial))
        stitched.resumed(partial[len(partial.rstrip()):] if dialect == "prefill" else "")
        request.resumes.by = served.provider
        # Its prompt as sent, were its usage not to come: the request and the partial answer.
        prompt = (len(request.raw) + len(partial.encode()) + 3) // 4
        return _joined(opened), _Continued(served.provider, prompt)

    def _order(self, alias: str) -> tuple[Route, ...]:
        """The alias's candidates after this provider, then those before it, then itself (the
        router puts those whose circuit is open or that cool down after them)."""
        routes = self.routes.get(alias, ())
        mine = [i for i, route in enumerate(routes) if route.provider == self.name]
        at = mine[0] if mine else len(routes)
        return (*routes[at + 1:], *routes[:at], *routes[at:at + 1])


@dataclass(frozen=True, slots=True)
class _Continued:
    """A continuation being read: who serves it, its prompt's tokens estimated."""

    provider: str
    prompt: int


class ContinuationRefused(ModelLimit):
    """A candidate refused the continuation it was asked for (a prefill it cannot take): the
    gateway's request, not the client's, so the next candidate is asked."""

    reason = "continuation_refused"


class _Continuing(Adapter):
    """A candidate asked to continue a broken stream: the request rewritten for the way it
    continues (`Provider.continues`: a prefill, or an instruction)."""

    kind = "continuing"

    def __init__(self, inner: Provider, partial: str, tokens: int) -> None:
        super().__init__(inner)
        self.partial = partial
        self.tokens = tokens

    async def answer(self, request: Outgoing, upstream_model: str) -> Answer:
        body = continuation(request.json(), self.partial, self.inner.continues(), self.tokens)
        asked = replace(request, raw=msgspec.json.encode(body), _json=body)
        try:
            return await self.inner.answer(asked, upstream_model)
        except UpstreamClientError as exc:
            raise ContinuationRefused(exc) from None


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


async def _joined(opened: Opened) -> AsyncGenerator[bytes, None]:
    """A peeked stream read again from its start; its watch reads what follows the head, as
    a relay's does, since the try's verdict at the stream's end is read from it."""
    rest, watch = opened.rest, opened.watch
    try:
        yield opened.head
        async for chunk in rest:
            watch.feed(chunk)
            yield chunk
    finally:
        await close_quietly(rest)
