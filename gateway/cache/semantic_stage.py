"""The semantic cache's stage: a chat question worded differently from one answered before,
within the same partition (`gateway.cache.semantic`), is answered with that answer.

Built for `/v1/chat/completions` when some alias has `cache.semantic`. Its last user turn is
embedded (`gateway.cache.embedding`): a failure there is a miss. The nearest question kept in
its partition is served at or above the alias's threshold, whole or as a stream, as the exact
cache serves its hits, with `x-llms-cache: semantic` and `x-llms-cache-similarity`. Otherwise the
answer, once complete, is kept under the question's vector, unless it calls tools and the alias
does not keep those.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass

import msgspec

from gateway.cache import semantic
from gateway.cache import store as cache
from gateway.cache.embedding import Embed
from gateway.cache.semantic_store import SemanticStore
from gateway.cache.stage import Caching, forwarded, kept_after, lookup
from gateway.cache.store import Cached
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.settings import Snapshot
from gateway.observe.metrics import Metrics
from providers.contract.stream import UNREADABLE_ANSWER

LABELS = "semantic_"  # of its lookups in `llms_cache_lookups_total`: semantic_hit, _miss


def caches(snapshot: Snapshot, endpoint: str) -> bool:
    """Whether some alias has a semantic cache for `endpoint`'s requests: the stage is built."""
    return endpoint == semantic.ENDPOINT and any(
        policy.cache.semantic is not None
        for policy in (snapshot.default_policy, *snapshot.policies.values()))


def stage_of(snapshot: Snapshot, store: SemanticStore, embed: Embed, metrics: Metrics) -> Stage:
    """The stage that answers a question near one kept, and keeps what it may."""

    async def stage(call: Call, following: Next) -> Delivery:
        policy = snapshot.policy(call.alias).cache
        settings, record = policy.semantic, call.record
        if settings is None or call.outgoing is None or record.model is None:
            return await following(call)
        read, write = cache.bypassed(call.headers)
        whose = semantic.owner(policy.scope, record.key_id, record.team)
        asked = semantic.question(call.outgoing.json(), call.alias, policy, settings, whose,
                                  forwarded(call)) if read or write else None
        if asked is None:
            return await following(call)
        vector = await embed(settings.embedding_alias, asked.text, record, settings.timeout)
        if vector is None:
            metrics.cache_lookup(record.model, f"{LABELS}error")
            return await following(call)
        if read and (hit := await _served(store, asked, vector, settings.threshold, call,
                                          metrics)):
            return hit
        delivery = await following(call)
        if not write:
            return delivery
        shelf = _Placing(store, vector, settings.tool_calls)
        kept = Caching(asked.partition, read, write, time.time() + settings.ttl, shelf, metrics,
                       labels=LABELS)
        return await kept_after(delivery, kept, record, call.wants_usage)

    return stage


async def _served(store: SemanticStore, asked: semantic.Question, vector: array[float],
                  threshold: float, call: Call, metrics: Metrics) -> Delivery:
    """The nearest kept answer when it is near enough, in the shape the client asked for."""
    found = await store.nearest(asked.partition, vector)
    if found is None or found[1] < threshold:
        metrics.cache_lookup(call.record.model or "", f"{LABELS}miss")
        return None
    entry, score = found
    marks = (("x-llms-cache", "semantic"), ("x-llms-cache-similarity", f"{score:.4f}"))
    caching = Caching(entry, True, False, 0.0, _Placing(store, vector, False), metrics, marks,
                      LABELS)
    return await lookup(caching, call.record, call.wants_usage)


@dataclass(frozen=True, slots=True)
class _Placing:
    """The semantic store as the exact cache's keeping reads a shelf: `put` keeps an answer
    under a partition and this question's vector; `get` reads an entry's answer."""

    store: SemanticStore
    vector: array[float]
    tool_calls: bool

    @property
    def max_entry_bytes(self) -> int:
        return self.store.max_entry_bytes

    async def get(self, key: str) -> Cached | None:
        return await self.store.answer(key)

    async def drop(self, key: str) -> None:
        await self.store.answers.drop(key)

    async def put(self, key: str, cached: Cached) -> int:
        if not self.tool_calls and _calls_tools(cached):
            return 0
        return await self.store.keep(key, self.vector, cached)


def _calls_tools(cached: Cached) -> bool:
    """Whether a kept answer calls a tool (a stream read as the whole answer it makes)."""
    try:
        whole = cache.whole_of(cached)
        return whole is None or semantic.has_tool_calls(msgspec.json.decode(whole))
    except UNREADABLE_ANSWER:
        return True  # unreadable: not kept
