"""`/v1/embeddings`: which providers may serve it, and a batch larger than a provider takes.

A batch past the provider's limit (`max_embedding_batch`) goes out as several calls, one after
another (a provider's rate limit is the reason it has a limit), and their answers are joined in
input order. A part that fails fails the whole try, so the router's failover applies to the
request as a whole: a client never gets half a batch (`Batched`, an adapter).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gateway.core.settings import Route
from providers.contract import embeddings
from providers.contract.errors import InvalidRequest
from providers.contract.provider import Adapter, Outgoing, Provider, Reply
from providers.contract.usage import Usage

ENDPOINT = "embeddings"


def embedding_routes(model: str, routes: tuple[Route, ...],
                     providers: Mapping[str, Provider]) -> tuple[Route, ...]:
    """The candidates whose kind can embed; a 400 naming `model` when none can."""
    able = tuple(r for r in routes if (p := providers.get(r.provider)) is not None
                 and p.serves(ENDPOINT, r.upstream_model))
    if not able:
        names = ", ".join(sorted({r.provider for r in routes}))
        raise InvalidRequest(f"Model '{model}' is not an embedding model: its providers "
                             f"({names}) cannot embed", param="model")
    return able


class Batched(Adapter):
    """A provider sent a batch larger than it takes as several calls, answers joined."""

    kind = "batched"

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        """The provider's answer to the whole request, in as many calls as its limit needs."""
        parts = embeddings.batches(request.json(), self.inner.embedding_batch_limit)
        if parts is None:
            return await self.inner.send(request, upstream_model)
        answers = []
        for part in parts:
            outgoing = Outgoing(ENDPOINT, msgspec.json.encode(part), request.model, False,
                                request.request_id, key_id=request.key_id,
                                priority=request.priority)
            reply = await self.inner.send(outgoing, upstream_model)
            answers.append(msgspec.json.decode(reply.body))
        answer = embeddings.joined(answers)
        return Reply(msgspec.json.encode(answer), usage=msgspec.convert(answer["usage"], Usage))
