"""The gateway's own OpenAPI document for the relay routes, served at `GET /openapi.json`.

The relay routes are plain ASGI (`gateway.edge.front`), so Litestar generates nothing for them.
Their request bodies are described by the very types the gateway checks them against
(`gateway.pipeline.schemas`), through msgspec's JSON Schema export: the document cannot drift from
what is enforced. Fields the gateway passes through untouched are open (`additionalProperties`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.pipeline import schemas
from providers.contract.messages import CountTokensRequest, MessagesRequest

ROUTES = {"/v1/chat/completions": schemas.ChatHead, "/v1/completions": schemas.CompletionHead,
          "/v1/responses": schemas.ResponsesHead, "/v1/embeddings": schemas.EmbeddingsHead,
          "/v1/messages": MessagesRequest, "/v1/messages/count_tokens": CountTokensRequest}
# The Messages API routes answer errors in Anthropic's shape.
ANTHROPIC_ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
REF = "#/components/schemas/{name}"


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    code: str | None
    param: str | None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


class AnthropicErrorBody(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorEnvelope(msgspec.Struct):
    type: str
    error: AnthropicErrorBody


def _error(name: str, shape: str) -> dict[str, Any]:
    return {"description": f"An error, in {shape} envelope",
            "content": {"application/json": {"schema": {"$ref": REF.format(name=name)}}}}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document for the relay routes."""
    heads = list(ROUTES.values())
    (*refs, _, _), components = msgspec.json.schema_components(
        [*heads, ErrorEnvelope, AnthropicErrorEnvelope], ref_template=REF)
    paths = {path: {"post": _operation(path, ref)} for (path, _), ref in zip(ROUTES.items(), refs,
                                                                            strict=True)}
    return {"openapi": "3.1.0",
            "info": {"title": "llms-gateway relay routes", "version": "1"},
            "paths": paths, "components": {"schemas": components}}


def _operation(path: str, ref: dict[str, Any]) -> dict[str, Any]:
    error = _error("AnthropicErrorEnvelope", "Anthropic's") if path in ANTHROPIC_ROUTES \
        else _error("ErrorEnvelope", "OpenAI's")
    answer = {"description": "The answer (JSON), or a server-sent event stream with "
                             "`stream: true`",
              "content": {"application/json": {"schema": {"type": "object"}},
                          "text/event-stream": {"schema": {"type": "string"}}}}
    return {"operationId": path.removeprefix("/v1/").replace("/", "_"),
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
            "responses": {"200": answer, **{status: error for status in (
                "400", "401", "404", "413", "429", "502", "503", "504")}}}
