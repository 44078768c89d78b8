"""Endpoints only a provider that has them can serve: no bridge makes one from chat.

Moderations, rerank, images and audio go to the kinds that list them in `Provider.endpoints`
(`openai`; the pool where its engine serves them), as the client sent them (the model renamed);
an alias none of whose providers has the endpoint is a 400 naming the model, as embeddings
answers for a chat-only alias. Uploads are bounded before they are read (`upload_limit`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core import endpoints
from gateway.core.settings import Route
from providers.contract.errors import InvalidRequest
from providers.contract.provider import Provider

UPLOADS = endpoints.UPLOADS  # bounded as OpenAI bounds them, and by `server.max_body_bytes`
ENDPOINTS = endpoints.NATIVE


def upload_limit(endpoint: str, max_body: int) -> int:
    """The most bytes a request body to `endpoint` may have."""
    return min(max_body, UPLOADS.get(endpoint, max_body))


def able_routes(endpoint: str, model: str, routes: tuple[Route, ...],
                providers: Mapping[str, Provider]) -> tuple[Route, ...]:
    """The candidates whose kind has `endpoint`; a 400 naming `model` when none has."""
    able = tuple(r for r in routes if (p := providers.get(r.provider)) is not None
                 and p.serves(endpoint, r.upstream_model))
    if not able:
        names = ", ".join(sorted({r.provider for r in routes}))
        raise InvalidRequest(f"Model '{model}' cannot serve /v1/{endpoint}: its providers "
                             f"({names}) do not have it", param="model")
    return able
