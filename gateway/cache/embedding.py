"""A question embedded for the semantic cache, through an alias of this gateway's own config.

The embedding alias's candidates are tried as any `/v1/embeddings` request's are: the router's
one failover loop (`gateway.routing.router.attempt`), over the providers as that endpoint
reaches them, with their breakers and cooldowns. What it costs is the request's own, beside its
answer (`Record.beside`). Any failure, a wrong answer or a try past the alias's `timeout` is a
miss: None, never an error, and never a wait past that bound.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import msgspec

from gateway.adapters.embeddings import ENDPOINT, embedding_routes
from gateway.cache.semantic import unit
from gateway.core.record import Record
from gateway.core.settings import Snapshot
from gateway.routing import router
from gateway.routing.router import Routing
from providers.contract.errors import GatewayError, ProviderError
from providers.contract.log import get_logger
from providers.contract.provider import Outgoing, Provider, Reply
from providers.contract.usage import Price

# (embedding alias, text, the request's record, seconds at most) -> a unit vector or None.
Embed = Callable[[str, str, Record, float], Awaitable["array[float] | None"]]


class _Embedding(msgspec.Struct):
    embedding: list[float]


class _Embeddings(msgspec.Struct):
    data: list[_Embedding]


_ANSWER = msgspec.json.Decoder(_Embeddings)


@dataclass(frozen=True, slots=True)
class Embedder:
    """Embeds one text through an alias, as the gateway routes `/v1/embeddings` (built per
    snapshot: `snapshot`'s providers, as that endpoint reaches them, in `adapted`)."""

    snapshot: Snapshot
    providers: Mapping[str, Provider]
    adapted: Mapping[str, Provider]
    prices: Mapping[tuple[str, str], Price]
    routing: Routing

    async def __call__(self, alias: str, text: str, record: Record, within: float
                       ) -> array[float] | None:
        """`text`'s unit vector by `alias`; None when it could not be had `within` seconds."""
        try:
            async with asyncio.timeout(within):
                return self._read(await self._embedded(alias, text, record), alias, record)
        except (GatewayError, ProviderError, TimeoutError, msgspec.DecodeError,
                msgspec.ValidationError) as exc:
            get_logger().info("semantic_cache_miss", request_id=record.request_id,
                              embedding_alias=alias, reason=type(exc).__name__)
            return None

    async def _embedded(self, alias: str, text: str, record: Record) -> router.Served:
        routes = embedding_routes(alias, router.candidates(self.snapshot, alias),
                                  self.providers)
        body = msgspec.json.encode({"model": alias, "input": text})
        request = Outgoing(ENDPOINT, body, alias, False, record.request_id,
                           key_id=record.key_id)
        return await router.attempt(alias, routes, self.adapted, request, self.routing)

    def _read(self, served: router.Served, alias: str, record: Record) -> array[float] | None:
        answer = served.answer
        if not isinstance(answer, Reply):  # an embedding never streams
            return None
        if answer.usage is not None:
            record.beside(answer.usage, self.prices.get((served.provider, alias)))
        data = _ANSWER.decode(answer.body).data
        return unit(data[0].embedding) if len(data) == 1 else None
