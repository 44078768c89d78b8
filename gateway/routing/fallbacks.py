"""Around the router: candidates too small skipped before any try, then the alias's fallback chain.

The requested alias's candidates that cannot hold the request (`gateway.routing.sizing`) are
skipped untried. When the others all fail, the class of their failure picks the alias's chain
(`models.<alias>.fallbacks`, `gateway.core.aliases`): `content_policy` when a model refused,
`context_window` when the request was too long, `rate_limit` when every try was rate limited,
else `default`. Each alias of the chain is tried with its own candidates, in its own order,
until one answers; the answer says which alias served (`x-llms-model`), and its cost is that
alias's model's.

When nothing answers, the client gets what is most true: the request is too long for every
window (400 `context_length_exceeded`, naming the largest window tried), or the content policy's
own refusal, or `provider_error` listing every attempt of every alias.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from gateway.core.errors import AllProvidersFailed, Attempt, ContextTooLong
from gateway.core.settings import Route, Snapshot
from gateway.routing import router, sizing
from gateway.routing.router import Routing, Served
from providers.contract.errors import GatewayError, UpstreamClientError
from providers.contract.provider import Answer, Outgoing, Provider, Reply
from providers.contract.refusals import filtered, filtered_first
from providers.contract.stream import Opened, settle

CONTEXT_REASONS = frozenset({sizing.TOO_SMALL, "context_length_exceeded"})
POLICY = "content_policy"
FILTERED = "the answer was filtered by the content policy before any content"


@dataclass(frozen=True, slots=True)
class Chain:
    """What trying beyond the first alias needs: the config, the providers as this endpoint
    reaches them, and per alias its ordered candidates and its routing."""

    snapshot: Snapshot
    providers: Mapping[str, Provider]
    candidates: Callable[[str], tuple[Route, ...]]
    routing: Callable[[str], Routing]


async def attempt(alias: str, routes: tuple[Route, ...], request: Outgoing, chain: Chain,
                  may_reach: frozenset[str] | None = None) -> tuple[str, Served]:
    """The alias that served and its answer; the most fitting error when nothing answered.
    `may_reach`: the fallback aliases this request may be served by (None: every one), so a
    key's allow-list and budget hold for its fallbacks as for the alias it asked."""
    # Estimated only when some candidate's numbers are known: the estimate reads every message.
    sized = _sized(routes, chain, alias)
    if not sized:  # no window to check, no chain to follow: the router's tries, as they are
        try:
            return alias, await router.attempt(alias, routes, chain.providers,
                                               as_alias(request, alias), chain.routing(alias))
        except AllProvidersFailed as exc:
            raise _failure(alias, list(exc.attempts), exc.refused, None, None) from None
    need = sizing.size(request.endpoint, request.json())
    failed: list[Attempt] = []
    refused: UpstreamClientError | None = None
    held: tuple[str, Served] | None = None  # an answer its content filter emptied
    stage: tuple[str, tuple[Route, ...]] | None = (alias, routes)
    rest: list[str] | None = None
    windows: list[int] = []
    while stage is not None:
        name, candidates = stage
        windows += [r.context_window for r in candidates if r.context_window is not None]
        kept, skipped = sizing.fitting(candidates, need)
        failed += skipped
        try:
            if kept:
                served = await _attempt(name, kept, request, chain, held)
                if failed:
                    served = msgspec.structs.replace(served, failed=(*failed, *served.failed))
                # Read only for an alias with a chain for refusals: it costs a decode.
                refusals = _within(chain.snapshot.chains.after(alias, POLICY), may_reach) \
                    if rest is None else ()
                if not (refusals and await _emptied(served.answer)):
                    if held is not None:
                        await held[1].answer.close()
                    return name, served
                failed = [*served.failed, Attempt(served.provider, 200, POLICY, FILTERED)]
                held, rest = (name, served), list(refusals)
        except AllProvidersFailed as exc:
            failed += exc.attempts
            refused = exc.refused or refused
        if rest is None:  # the requested alias failed: why it failed picks its chain
            rest = _within(chain.snapshot.chains.after(alias, failure_class(failed)), may_reach)
        stage = _next(rest, chain)
    if held is not None:  # nothing else answered: the filtered answer is the answer
        return held[0], msgspec.structs.replace(held[1], failed=tuple(failed))
    raise _failure(alias, failed, refused, max(windows, default=None), need)


async def _attempt(alias: str, routes: tuple[Route, ...], request: Outgoing, chain: Chain,
                   held: tuple[str, Served] | None) -> Served:
    """`alias`'s candidates tried; an answer held meanwhile is closed if the request ends here
    (the client left, a bad request)."""
    try:
        return await router.attempt(alias, routes, chain.providers, as_alias(request, alias),
                                    chain.routing(alias))
    except AllProvidersFailed:
        raise  # the chain goes on
    except BaseException:
        if held is not None:
            await held[1].answer.close()
        raise


async def _emptied(answer: Answer) -> bool:
    """A whole answer, or a stream, that a content filter stopped before any content. A
    stream is read on until its first content (or its end): events that write nothing (a
    role, filter results) come first, so the filter's finish may follow them; the first
    content is never waited past, nor anything after it."""
    if isinstance(answer, Reply):
        return filtered([answer.body])
    if isinstance(answer, Opened) and answer.media_type is None:
        try:
            return await settle(answer, filtered_first)
        except BaseException:  # the client left while the stream was read: let it go
            await answer.close()
            raise
    return False


def _within(aliases: tuple[str, ...], may_reach: frozenset[str] | None) -> list[str]:
    return list(aliases) if may_reach is None else [a for a in aliases if a in may_reach]


def _sized(routes: tuple[Route, ...], chain: Chain, alias: str) -> bool:
    for route in routes:  # once per request: a plain loop, no generator
        if route.context_window is not None or route.max_output_tokens is not None:
            return True
    fallen = chain.snapshot.chains.chains.get(alias)
    return fallen is not None and any(fallen.values())


def failure_class(failed: Sequence[Attempt]) -> str:
    """Why an alias's candidates failed, as a fallback class."""
    reasons = {a.reason for a in failed}
    if POLICY in reasons:
        return POLICY
    if reasons & CONTEXT_REASONS:
        return "context_window"
    if reasons == {"rate_limited"}:
        return "rate_limit"
    return "default"


def _next(rest: list[str], chain: Chain) -> tuple[str, tuple[Route, ...]] | None:
    """The next alias of the chain that has candidates now (an alias whose providers are all
    disabled is passed over)."""
    while rest:
        name = rest.pop(0)
        try:
            return name, chain.candidates(name)
        except GatewayError:
            continue
    return None


def as_alias(request: Outgoing, alias: str) -> Outgoing:
    """The request as `alias` sends it, its body's `model` too (a kind sends the body as it is
    when the names agree); answers the gateway writes name the alias serving."""
    return request if request.model == alias else request.renamed(alias)


def _failure(model: str, failed: list[Attempt], refused: UpstreamClientError | None,
             largest: int | None, need: sizing.Size | None) -> GatewayError:
    if failed and {a.reason for a in failed} <= CONTEXT_REASONS:
        return ContextTooLong(model, largest, need.total if need else None)
    if refused is not None:
        return refused
    return AllProvidersFailed(model, failed)
