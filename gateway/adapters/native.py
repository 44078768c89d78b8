"""Endpoints only a provider that has them can serve: no bridge makes one from chat.

Moderations, rerank, images and audio go to the kinds that list them in `Provider.endpoints`
(`openai`; the pool where its engine serves them), as the client sent them (the model renamed);
an alias none of whose providers has the endpoint is a 400 naming the model, as embeddings
answers for a chat-only alias. Uploads are bounded before they are read (`upload_limit`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.settings import Route
from providers.contract.errors import InvalidRequest
from providers.contract.provider import Provider

MB = 1024 * 1024
# OpenAI's own limits on an upload (its API reference: audio files up to 25 MB, images for an
# edit up to 50 MB); `server.max_body_bytes` bounds them too, whichever is lower.
UPLOADS: Mapping[str, int] = {"audio/transcriptions": 25 * MB, "audio/translations": 25 * MB,
                              "images/edits": 50 * MB}
ENDPOINTS = ("moderations", "rerank", "images/generations", "audio/speech", *UPLOADS)


def upload_limit(endpoint: str, max_body: int) -> int:
    """The most bytes a request body to `endpoint` may have."""
    return min(max_body, UPLOADS.get(endpoint, max_body))


def able_routes(endpoint: str, model: str, routes: tuple[Route, ...],
                providers: Mapping[str, Provider]) -> tuple[Route, ...]:
    """The candidates whose kind has `endpoint`; a 400 naming `model` when none has."""
    able = tuple(r for r in routes if (p := providers.get(r.provider)) is not None
                 and p.supports(endpoint))
    if not able:
        names = ", ".join(sorted({r.provider for r in routes}))
        raise InvalidRequest(f"Model '{model}' cannot serve /v1/{endpoint}: its providers "
                             f"({names}) do not have it", param="model")
    return able
