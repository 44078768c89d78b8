"""The cache's stage: a request is looked up before it is routed, and its answer kept once it
completed (`gateway.cache.store` holds the rules and the store). Built for the endpoints the
cache serves, when the defaults or some alias give the cache a `ttl`."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from gateway.cache import store as cache
from gateway.cache.semantic import owner
from gateway.cache.store import Cached, ResponseCache
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.delivery import Streamed, Whole, kept_stream
from gateway.core.record import Outcome, Record
from gateway.core.settings import Snapshot
from gateway.observe.metrics import Metrics
from providers.contract.stream import UNREADABLE_ANSWER, close_quietly
from providers.contract.usage import Usage, from_payload
from providers.wire import sse


def caches(snapshot: Snapshot, endpoint: str) -> bool:
    """Whether a request to `endpoint` may be cached under `snapshot`: the stage is built."""
    return endpoint in cache.ENDPOINTS and any(
        policy.cache.ttl for policy in (snapshot.default_policy, *snapshot.policies.values()))


def stage_of(snapshot: Snapshot, store: ResponseCache, metrics: Metrics) -> Stage:
    """The stage that answers from the cache, and keeps what it may."""

    async def stage(call: Call, following: Next) -> Delivery:
        policy = snapshot.policy(call.alias).cache
        kept = caching(call.headers, call.record, policy.ttl, call.outgoing.json(), store,
                       metrics, forwarded(call), policy.scope) \
            if policy.ttl and call.outgoing is not None else None
        if kept is None:
            return await following(call)
        if hit := await lookup(kept, call.record, call.wants_usage):
            return hit
        delivery = await following(call)
        if not kept.write or call.record.cache_hit:  # a semantic hit is not this body's own
            return delivery
        return await kept_after(delivery, kept, call.record, call.wants_usage)

    return stage


class Shelf(Protocol):
    """Where a cache keeps answers by key (`ResponseCache`; the semantic cache's entries)."""

    @property
    def max_entry_bytes(self) -> int: ...

    async def get(self, key: str) -> Cached | None: ...

    async def drop(self, key: str) -> None: ...

    async def put(self, key: str, cached: Cached) -> int: ...


HIT = (("x-llms-cache", "hit"),)


@dataclass(frozen=True, slots=True)
class Caching:
    """A cacheable request: its key, whether the client lets it be read and written, when
    what it stores expires, and where; the headers a hit carries, and the prefix of its
    lookups' metric labels (the semantic cache's `semantic_`)."""

    key: str
    read: bool
    write: bool
    expires: float
    store: Shelf
    metrics: Metrics
    marks: tuple[tuple[str, str], ...] = HIT
    labels: str = ""


def forwarded(call: Call) -> list[str]:
    """The client's betas some provider would send upstream with this call: those alone can
    change its answer (the others are dropped before any upstream sees them)."""
    outgoing = call.outgoing
    if outgoing is None or not outgoing.betas:
        return []
    return sorted({beta for provider in call.providers.values()
                   for beta in provider.forwarded_betas(outgoing)})


def caching(headers: Mapping[str, str], record: Record, ttl: float | None,
            body: Mapping[str, Any], store: ResponseCache, metrics: Metrics,
            betas: Sequence[str] = (), scope: str = "key") -> Caching | None:
    """How the cache takes this request (`betas`: those that may reach an upstream; `scope`:
    whose answers it may be served); None when its alias is not cached."""
    if not ttl or record.endpoint not in cache.ENDPOINTS or record.model is None:
        return None
    read, write = cache.bypassed(headers)
    whose = record.key_id if scope == "key" else owner(scope, record.key_id, record.team)
    key = cache.key_of(record.endpoint, record.model, body, whose, betas)
    if not read:
        metrics.cache_lookup(record.model, "bypass")
    return Caching(key, read, write, time.time() + ttl, store, metrics)


async def lookup(caching: Caching, record: Record, wants_usage: bool) -> Whole | Streamed | None:
    """The kept answer in the shape the client asked for; None (a miss) if there is none."""
    model = record.model or ""
    found = await caching.store.get(caching.key) if caching.read else None
    try:
        kept = None if found is None else cache.stream_of(found, wants_usage) \
            if record.stream else cache.whole_of(found)
    except UNREADABLE_ANSWER:  # checked sound, yet past what the other form can be made of
        await caching.store.drop(caching.key)
        found = kept = None
    if found is None or kept is None:
        if caching.read:
            caching.metrics.cache_lookup(model, f"{caching.labels}miss")
        return None
    caching.metrics.cache_lookup(model, f"{caching.labels}hit")
    record.provider, record.cache_hit = found.provider, True
    for header, value in caching.marks:
        record.mark(header, value)
    if not record.stream:
        record.used(from_payload(kept), None)  # what was paid beside it (an embedding) only
        return Whole(kept, record.headers(), record)
    return kept_stream(kept, record, _stream_usage(kept))


def _stream_usage(kept: bytes) -> Usage | None:
    """The usage a kept stream reported: its last event that carries one (the one SSE reader
    reads it, `[DONE]` and comments skipped)."""
    if b'"usage"' not in kept:
        return None
    for event in reversed(sse.Reader().feed(kept)):
        if b'"usage"' in event.data and not event.done:
            return from_payload(event.data)
    return None


async def kept_after(delivery: Delivery, caching: Caching, record: Record, wants_usage: bool
                     ) -> Delivery:
    """The answer as it goes to the client: a stream kept once it completed, a whole answer
    that succeeded kept now."""
    if isinstance(delivery, Streamed) and delivery.media_type == "text/event-stream":
        return keeping(delivery, caching, wants_usage)
    if isinstance(delivery, Whole) and delivery.status == 200 \
            and delivery.outcome is Outcome.COMPLETED:
        await keep_whole(caching, record, delivery.body)
    return delivery


async def keep_whole(caching: Caching, record: Record, body: bytes) -> None:
    """Keep a whole answer that succeeded."""
    await _keep(caching, record, Cached(record.endpoint, record.provider or "",
                                        caching.expires, body=body))


def keeping(streamed: Streamed, caching: Caching, wants_usage: bool) -> Streamed:
    """The stream as it goes to the client, kept once it completed (and if it fits)."""
    kept = _kept_stream(streamed.chunks, caching, streamed.record, wants_usage)
    return msgspec.structs.replace(streamed, chunks=kept)


async def _kept_stream(chunks: AsyncGenerator[bytes, None], caching: Caching, record: Record,
                       wants_usage: bool) -> AsyncGenerator[bytes, None]:
    sent: list[bytes] = []
    size = 0
    limit = caching.store.max_entry_bytes
    try:
        async for chunk in chunks:
            if size <= limit:
                sent.append(chunk)
                size += len(chunk)
            yield chunk
    finally:
        await close_quietly(chunks)
    if record.outcome is Outcome.COMPLETED and size <= limit:
        await _keep(caching, record, Cached(record.endpoint, record.provider or "",
                                            caching.expires, chunks=b"".join(sent),
                                            stream_usage=wants_usage))


async def _keep(caching: Caching, record: Record, cached: Cached) -> None:
    if size := await caching.store.put(caching.key, cached):
        caching.metrics.cache_stored(record.model or "", size)
