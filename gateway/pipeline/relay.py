"""The pipeline of one relayed request, top to bottom: admit, look up the cache, route, deliver.

Shared by every relay route (chat, completions, responses, embeddings, messages, moderations,
rerank, images, audio): endpoint
differences live in the request heads (`schemas`), the adapters built per config snapshot
(`adapters.stack`) and the provider kinds, not here. The request's record (`record`) is filled on
the way and ended once, by whoever delivers its last byte.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import Any

from gateway.adapters.messages import ENDPOINTS as MESSAGES_ENDPOINTS
from gateway.edge.disconnect import ClientDisconnected, DisconnectGuard
from gateway.pipeline import caching, fallbacks, idempotency, router
from gateway.pipeline.admission import Admitted, Caller, Incoming, admit, ordered
from gateway.pipeline.delivery import (
    STREAM_HEADERS,
    Streamed,
    Whole,
    error_delivery,
    internal_error,
)
from gateway.pipeline.record import Outcome, Record, request_id
from gateway.pipeline.schemas import FormHead
from gateway.pipeline.streaming import relay, relay_bytes
from gateway.state.runtime import Live, Runtime
from providers.contract.errors import GatewayError
from providers.contract.provider import Gathering, Outgoing, Reply
from providers.contract.stream import Opened
from providers.contract.usage import Price


async def handle(request: Incoming, endpoint: str, runtime: Runtime,
                 caller: Caller | None = None) -> Whole | Streamed | None:
    """Serve one relay request end to end; every failure leaves as the error envelope, and a
    client that left gets nothing (None). `caller`: the key a request with no client runs as
    (a batch's, `gateway.batches.runner`).

    The caller holds the request's in-flight slot (`Runtime.enter`) for as long as the answer
    is being sent, a stream included."""
    live = runtime.live
    record = Record(request_id(request.headers), endpoint, runtime.listeners)
    try:
        admitted = await admit(request, runtime, record, caller)
        runtime.stage("admitted")
        if (sent := idempotency.keyed(request.headers, record)) is not None:
            # The run is the flight's, not this client's: no disconnect guard of its own.
            return await idempotency.answer(
                runtime.idempotency, sent, admitted.raw, record, live.snapshot.idempotency,
                request.receive, lambda: _serve(request, admitted, record, runtime, live,
                                                contextlib.nullcontext()))
    except GatewayError as exc:
        return error_delivery(exc, record, live.redactor)
    except Exception:  # a bug: logged with its traceback and counted, as every request is
        return internal_error(record, live.redactor)
    return await _serve(request, admitted, record, runtime, live,
                        DisconnectGuard(request.receive))


async def _serve(request: Incoming, admitted: Admitted, record: Record, runtime: Runtime,
                 live: Live, guard: AbstractAsyncContextManager[Any]
                 ) -> Whole | Streamed | None:
    """An admitted request past admission: the cache, the router, the answer's delivery;
    `guard` ends the wait for the router when the client leaves."""
    endpoint = record.endpoint
    try:
        head = admitted.head
        options = getattr(head, "stream_options", None)
        wants_usage = bool(options and options.include_usage) \
            or endpoint in MESSAGES_ENDPOINTS
        alias = admitted.alias
        outgoing = Outgoing(endpoint, admitted.raw, head.model, record.stream,
                            record.request_id, client_wants_usage=wants_usage,
                            key_id=record.key_id, choices=getattr(head, "n", None) or 1,
                            betas=request.headers.get("anthropic-beta"),
                            priority=admitted.priority,
                            content_type=request.headers.get("content-type")
                            if isinstance(head, FormHead) else None)
        outgoing = fallbacks.as_alias(outgoing, alias)
        record.resumes = outgoing.resumes
        policy = live.snapshot.policy(alias)
        cached = caching.caching(request.headers, record, policy.cache.ttl, outgoing.json(),
                                 runtime.cache, runtime.metrics) \
            if policy.cache.ttl else None
        if cached is not None and (hit := await caching.lookup(cached, record, wants_usage)):
            return hit
        chain = fallbacks.Chain(live.snapshot, admitted.providers,
                                lambda name: ordered(runtime, endpoint, name),
                                lambda name: _routing(runtime, name))
        runtime.stage("provider")
        async with guard:
            record.alias, served = await fallbacks.attempt(alias, admitted.routes, outgoing,
                                                           chain)
        runtime.stage("reply")
    except GatewayError as exc:
        return error_delivery(exc, record, live.redactor)
    except ClientDisconnected:
        record.end(Outcome.CLIENT_LEFT)
        return None
    except Exception:  # a bug: logged with its traceback and counted, as every request is
        return internal_error(record, live.redactor)
    record.provider, record.failed = served.provider, served.failed
    record.hedged, record.hedge_won = served.hedged, served.hedge_won
    price = live.prices.get((served.provider, record.alias))
    answer = served.answer
    if isinstance(answer, Opened) and answer.media_type is not None:  # audio bytes, as they come
        record.first_token()
        return Streamed(relay_bytes(answer, served.provider, record),
                        {**record.headers(), **STREAM_HEADERS}, record,
                        media_type=answer.media_type)
    if isinstance(answer, Opened):
        record.first_token()
        streamed = Streamed(relay(answer, served.provider, record, live.redactor, price,
                                  strip_usage=not wants_usage),
                            {**record.headers(), **STREAM_HEADERS}, record)
        return caching.keeping(streamed, cached, wants_usage) \
            if cached is not None and cached.write else streamed
    assert not isinstance(answer, Gathering), "the router reads a gathering answer to its end"
    record.upstream_time = served.upstream_time  # a stream's is its whole life: not counted
    return await _whole(answer, record, price, cached)


def _routing(runtime: Runtime, alias: str) -> router.Routing:
    """How `alias`'s candidates are tried: health, latencies, its own hedging."""
    policy = runtime.live.snapshot.policy(alias).routing
    hedging = runtime.hedging.of(alias, policy.hedge_after, policy.hedge_budget)
    return router.Routing(runtime.health, runtime.latencies, hedging)


async def _whole(reply: Reply, record: Record, price: Price | None,
                 cached: caching.Caching | None) -> Whole:
    record.used(reply.usage, price)
    if cached is not None and cached.write:
        await caching.keep_whole(cached, record, reply.body)
    return Whole(reply.body, record.headers(), record, media_type=reply.content_type)


def bug(request: Incoming, endpoint: str, runtime: Runtime) -> Whole:
    """The answer to a bug that escaped `handle`, called where it is caught: logged with its
    traceback and request id, counted as a 500."""
    record = Record(request_id(request.headers), endpoint, runtime.listeners)
    return internal_error(record, runtime.live.redactor)
