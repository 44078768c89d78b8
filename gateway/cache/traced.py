"""The response cache with each lookup in a span, built instead of the plain one when tracing is
on (`gateway.observe.tracing`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace

from gateway.cache.store import Cached, ResponseCache
from gateway.observe.tracing import current

if TYPE_CHECKING:
    from redis.asyncio import Redis


class TracedCache(ResponseCache):
    """The response cache with a span per lookup (`llms.cache.lookup`) under the request's."""

    def __init__(self, tracer: trace.Tracer, max_bytes: int, max_entry_bytes: int,
                 redis: Redis | None = None, prefix: str = "") -> None:
        super().__init__(max_bytes, max_entry_bytes, redis, prefix)
        self.tracer = tracer

    async def get(self, key: str) -> Cached | None:
        if current() is None:  # not traced, or not sampled
            return await super().get(key)
        with self.tracer.start_as_current_span("llms.cache.lookup") as span:
            found = await super().get(key)
            span.set_attribute("llms.cache_hit", found is not None)
            if found is not None:
                span.set_attribute("llms.provider", found.provider)
            return found
