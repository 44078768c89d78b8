"""The gateway's own OpenAPI document for the relay routes, served at `GET /openapi.json`.

The relay routes are plain ASGI (`gateway.edge.front`), so Litestar generates nothing for them.
Their request bodies are described by the very types the gateway checks them against
(`gateway.core.schemas`), through msgspec's JSON Schema export: the document cannot drift from
what is enforced. Fields the gateway passes through untouched are open (`additionalProperties`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.core import schemas
from gateway.core.messages import CountTokensRequest, MessagesRequest

# Uploads (`multipart/form-data`): the head's text fields, and its files as binary parts.
FORMS: dict[str, type[schemas.FormHead]] = {
    "/v1/audio/transcriptions": schemas.TranscriptionHead,
    "/v1/audio/translations": schemas.TranscriptionHead,
    "/v1/images/edits": schemas.ImageEditHead}
ROUTES = {"/v1/chat/completions": schemas.ChatHead, "/v1/completions": schemas.CompletionHead,
          "/v1/responses": schemas.ResponsesHead, "/v1/embeddings": schemas.EmbeddingsHead,
          "/v1/messages": MessagesRequest, "/v1/messages/count_tokens": CountTokensRequest,
          "/v1/moderations": schemas.ModerationsHead, "/v1/rerank": schemas.RerankHead,
          "/v1/images/generations": schemas.ImagesHead, "/v1/audio/speech": schemas.SpeechHead,
          **FORMS}
# What the answers are when they are not JSON: audio bytes; a transcript as text.
MEDIA = {"/v1/audio/speech": "audio/*", "/v1/audio/transcriptions": "text/plain",
         "/v1/audio/translations": "text/plain"}
# The Messages API routes answer errors in Anthropic's shape.
ANTHROPIC_ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})
REF = "#/components/schemas/{name}"
PASSTHROUGH = "/passthrough/{provider}/{path}"


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
    """The OpenAPI 3.1 document for the relay routes and the passthrough."""
    heads = list(ROUTES.values())
    (*refs, _, _), components = msgspec.json.schema_components(
        [*heads, ErrorEnvelope, AnthropicErrorEnvelope], ref_template=REF)
    _checked_after_decoding(components)
    paths = {path: {"post": _operation(path, _body(path, ref, components))}
             for (path, _), ref in zip(ROUTES.items(), refs, strict=True)}
    paths[PASSTHROUGH] = _passthrough()
    return {"openapi": "3.1.0",
            "info": {"title": "llms-gateway relay routes", "version": "1"},
            "paths": paths, "components": {"schemas": components}}


def _checked_after_decoding(components: dict[str, Any]) -> None:
    """What a head checks beyond its types, said in its schema too: Anthropic requires
    `max_tokens` (`MessagesRequest.__post_init__`), which the struct can only default."""
    messages = components["MessagesRequest"]
    messages["required"] = [*messages.get("required", ()), "max_tokens"]
    messages["properties"]["max_tokens"] = {
        k: v for k, v in messages["properties"]["max_tokens"].items() if k != "default"}


def _passthrough() -> dict[str, Any]:
    """`/passthrough/{provider}/{path}`: any method, relayed as it is to the paths a provider
    allows (`path` may hold slashes)."""
    described = {"description": "The upstream's answer as it came (status, body), redacted",
                 "content": {"*/*": {"schema": {}}}}
    operation = {"responses": {"200": described, **{status: _error("ErrorEnvelope", "OpenAI's")
                                                    for status in ("401", "404", "413", "502",
                                                                   "504")}}}
    parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in ("provider", "path")]
    return {"parameters": parameters,
            **{method: {**operation, "operationId": f"passthrough_{method}"}
               for method in ("get", "post", "put", "patch", "delete")}}


def _body(path: str, ref: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """A route's request body: JSON as its head says, or an upload with its files."""
    form = FORMS.get(path)
    if form is None:
        return {"application/json": {"schema": ref}}
    schema = dict(components[ref["$ref"].rsplit("/", 1)[-1]])
    binary = {"type": "string", "format": "binary"}
    schema["properties"] = {**schema.get("properties", {}), **dict.fromkeys(form.files, binary)}
    schema["required"] = [*schema.get("required", ()), *form.files]
    return {"multipart/form-data": {"schema": schema}}


def _operation(path: str, body: dict[str, Any]) -> dict[str, Any]:
    error = _error("AnthropicErrorEnvelope", "Anthropic's") if path in ANTHROPIC_ROUTES \
        else _error("ErrorEnvelope", "OpenAI's")
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}},
                               "text/event-stream": {"schema": {"type": "string"}}}
    if path in MEDIA:
        content[MEDIA[path]] = {"schema": {"type": "string", "format": "binary"}}
    answer = {"description": "The answer (JSON), or a server-sent event stream with "
                             "`stream: true`", "content": content}
    return {"operationId": path.removeprefix("/v1/").replace("/", "_"),
            "requestBody": {"required": True, "content": body},
            "responses": {"200": answer, **{status: error for status in (
                "400", "401", "404", "413", "429", "502", "503", "504")}}}
