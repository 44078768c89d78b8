"""The relay: the innermost call of every relay endpoint's stages, and the one door into them.

`handle` runs a call through its endpoint's stages (`gateway.pipeline.stack`, composed per
config snapshot) and turns whatever escapes them into the answer a client reads: a
`GatewayError` its envelope, a client that left nothing, a bug a logged 500. `serve` is the
bottom of every stack: the alias's candidates tried (`gateway.routing.fallbacks`, with its
fallback chain) and the answer delivered, whole or as a stream. It has no branch for any
capability: those are stages around it, adapters under it, or listeners on its record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from gateway.accounts import pricing
from gateway.core.call import Call, ClientDisconnected, Delivery, Next
from gateway.core.delivery import (
    STREAM_HEADERS,
    Streamed,
    Whole,
    error_delivery,
    internal_error,
)
from gateway.core.record import Outcome, Record, request_id
from gateway.core.streaming import relay, relay_bytes
from gateway.pipeline.admission import ordered
from gateway.routing import fallbacks, router
from gateway.state.runtime import Live, Runtime
from providers.contract.errors import GatewayError
from providers.contract.provider import Gathering, Outgoing
from providers.contract.redact import Redactor
from providers.contract.stream import Opened
from providers.contract.usage import Usage


async def handle(call: Call, runtime: Runtime) -> Delivery:
    """Serve one call end to end through its endpoint's stages; every failure leaves as the
    error envelope, and a client that left gets nothing (None). Whoever runs the call closes
    it (`Call.close`) once its answer is sent, a stream included."""
    live = runtime.live
    try:
        return await live.stacks[call.endpoint](call)
    except Exception as exc:  # every failure leaves as an answer
        return fallen(exc, call.record, live.redactor)


def fallen(exc: Exception, record: Record, redactor: Redactor) -> Delivery:
    """What a client gets for a failure: a `GatewayError`'s envelope, nothing when it left, a
    logged 500 for a bug (counted, as every request is)."""
    if isinstance(exc, GatewayError):
        return error_delivery(exc, record, redactor)
    if isinstance(exc, ClientDisconnected):
        record.end(Outcome.CLIENT_LEFT)
        return None
    return internal_error(record, redactor)


def innermost(runtime: Runtime, live: Live, endpoint: str) -> Next:
    """The bottom of `endpoint`'s stack for `live`'s snapshot: route, then deliver."""
    # Each alias's routing is fixed for the snapshot (its policy; the registries live on):
    # made for its first call, then reused.
    routings: dict[str, router.Routing] = {}

    def routing(alias: str) -> router.Routing:
        found = routings.get(alias)
        if found is None:
            found = routings[alias] = _routing(runtime, live, alias)
        return found

    chain = fallbacks.Chain(live.snapshot, live.adapted[endpoint],
                            lambda name: ordered(runtime, live, endpoint, name), routing)

    async def serve(call: Call) -> Delivery:
        record, outgoing = call.record, call.outgoing
        assert outgoing is not None, "admission builds the request before it is served"
        asked = call.asked  # a request's own sort and price bound hold for its fallbacks too
        followed = chain if asked is None else dataclasses.replace(
            chain, candidates=lambda name: ordered(runtime, live, endpoint, name, asked))
        try:
            if runtime.trace is not None:
                runtime.trace("provider")
            began = time.perf_counter()
            try:
                async with call.watching():
                    record.alias, served = await fallbacks.attempt(
                        call.alias, call.routes, outgoing, followed, call.may_reach)
            finally:
                record.upstream_wait += time.perf_counter() - began
            if runtime.trace is not None:
                runtime.trace("reply")
        except Exception as exc:  # a flight's run must end as an answer too
            return fallen(exc, record, live.redactor)
        record.provider, record.failed = served.provider, served.failed
        record.hedged, record.hedge_won = served.hedged, served.hedge_won
        if served.lost:
            _lost(served.lost, record, outgoing, live)
        price = live.prices.get((served.provider, record.alias))
        answer = served.answer
        if isinstance(answer, Opened):
            record.first_token()
            chunks = relay_bytes(answer, served.provider, record) \
                if answer.media_type is not None \
                else relay(answer, served.provider, record, live.redactor, price,
                           strip_usage=not call.wants_usage)
            return Streamed(chunks, {**record.headers(), **STREAM_HEADERS}, record,
                            media_type=answer.media_type or "text/event-stream")
        assert not isinstance(answer, Gathering), "the router reads a gathering to its end"
        record.upstream_time = served.upstream_time  # a stream's is its whole life: not counted
        record.used(answer.usage, price)
        return Whole(answer.body, record.headers(), record, media_type=answer.content_type)

    return serve


def _lost(lost: tuple[router.Lost, ...], record: Record, outgoing: Outgoing, live: Live
          ) -> None:
    """The hedges that lost, charged as their providers bill a request cancelled once sent:
    its usage when it came, else its prompt (estimated as the budget's hold estimates it)."""
    prompt = Usage(prompt_tokens=pricing.estimate(outgoing.endpoint, outgoing.raw).prompt)
    alias = record.alias or ""
    record.lost = tuple(try_.provider for try_ in lost)
    for try_ in lost:
        record.beside(try_.usage or prompt, live.prices.get((try_.provider, alias)))


def _routing(runtime: Runtime, live: Live, alias: str) -> router.Routing:
    """How `alias`'s candidates are tried under `live`: health, latencies, its own hedging."""
    policy = live.snapshot.policy(alias).routing
    hedging = runtime.hedging.of(alias, policy.hedge_after, policy.hedge_budget,
                                 policy.hedge_min)
    return router.Routing(runtime.health, runtime.latencies, hedging)


def bug(headers: Mapping[str, str], endpoint: str, runtime: Runtime) -> Whole:
    """The answer to a bug that escaped `handle`, called where it is caught: logged with its
    traceback and request id, counted as a 500."""
    record = Record(request_id(headers), endpoint, runtime.listeners)
    return internal_error(record, runtime.live.redactor)
