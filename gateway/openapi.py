"""The gateway's own OpenAPI document for the relay routes, served at `GET /openapi.json`.

The relay routes are plain ASGI (`gateway.front`), so Litestar generates nothing for them. Their
request bodies are described by the very types the gateway checks them against
(`gateway.schemas`), through msgspec's JSON Schema export: the document cannot drift from what
is enforced. Fields the gateway passes through untouched are open (`additionalProperties`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway import schemas

ROUTES = {"/v1/chat/completions": schemas.ChatHead, "/v1/completions": schemas.CompletionHead,
          "/v1/responses": schemas.ResponsesHead, "/v1/embeddings": schemas.EmbeddingsHead}
REF = "#/components/schemas/{name}"
ERROR = {"description": "An error, in OpenAI's envelope",
         "content": {"application/json": {"schema": {"$ref": REF.format(name="ErrorEnvelope")}}}}


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    code: str | None
    param: str | None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document for the relay routes."""
    heads = list(ROUTES.values())
    (*refs, _), components = msgspec.json.schema_components(
        [*heads, ErrorEnvelope], ref_template=REF)
    paths = {path: {"post": _operation(path, ref)} for (path, _), ref in zip(ROUTES.items(), refs,
                                                                            strict=True)}
    return {"openapi": "3.1.0",
            "info": {"title": "llms-gateway relay routes", "version": "1"},
            "paths": paths, "components": {"schemas": components}}


def _operation(path: str, ref: dict[str, Any]) -> dict[str, Any]:
    answer = {"description": "The answer (JSON), or a server-sent event stream with "
                             "`stream: true`",
              "content": {"application/json": {"schema": {"type": "object"}},
                          "text/event-stream": {"schema": {"type": "string"}}}}
    return {"operationId": path.removeprefix("/v1/").replace("/", "_"),
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
            "responses": {"200": answer, "400": ERROR, "401": ERROR, "404": ERROR, "413": ERROR,
                          "429": ERROR, "502": ERROR, "503": ERROR, "504": ERROR}}
