"""A fake Azure OpenAI resource: what Azure checks, and answers in Azure's shape.

Requests go to `/openai/deployments/{deployment}/{chat/completions|completions|embeddings}`
with a supported `api-version` query and an `api-key` header (or an Entra ID bearer token the
fake knows); anything else gets Azure's own error answers. Answers are the OpenAI fake's
(`tests.upstream`, same modes) with what Azure adds: `prompt_filter_results` and per-choice
`content_filter_results`, and in a stream a first chunk with no choices that carries the
prompt's filter results. `FakeEntra` is a Microsoft Entra ID token endpoint over TLS whose
tokens the fake resource accepts.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.upstream import (
    FakeUpstream,
    Mode,
    _ChatShape,
    _CompletionShape,
    _EmbeddingShape,
    _Shape,
)

API_VERSIONS = frozenset({"2024-02-01", "2024-06-01", "2024-10-21", "2025-01-01-preview",
                          "2025-04-01-preview"})
SAFE = {name: {"filtered": False, "severity": "safe"}
        for name in ("hate", "self_harm", "sexual", "violence")}
FILTERED = {**SAFE, "violence": {"filtered": True, "severity": "medium"}}
PROMPT_FILTERED = {"error": {
    "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
               "management policy. Please modify your prompt and retry. To learn more about "
               "our content filtering policies please read our documentation: "
               "https://go.microsoft.com/fwlink/?linkid=2198766",
    "type": None, "param": "prompt", "code": "content_filter", "status": 400,
    "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": FILTERED}}}
BAD_KEY = {"error": {"code": "401", "message": (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide "
    "a valid key for an active subscription and use a correct regional API endpoint for your "
    "resource.")}}
BAD_TOKEN = {"error": {"code": "401", "message": (
    "Unauthorized. Access token is missing, invalid, audience is incorrect "
    "(https://cognitiveservices.azure.com), or have expired.")}}
NOT_FOUND = {"error": {"code": "404", "message": "Resource not found"}}
BAD_VERSION = {"error": {"code": "BadRequest", "message": "API version not supported"}}
NO_DEPLOYMENT = {"error": {"code": "DeploymentNotFound", "message": (
    "The API deployment for this resource does not exist. If you created the deployment within "
    "the last 5 minutes, please wait a moment and try again.")}}
ENDPOINTS = {"chat/completions": _ChatShape, "completions": _CompletionShape,
             "embeddings": _EmbeddingShape}


def prompt_filtered() -> Mode:
    """Azure's 400 for a prompt its content filter refused."""
    return Mode("status", code=400, body=json.dumps(PROMPT_FILTERED).encode())


def answer_filtered() -> Mode:
    """An answer the content filter stopped before any of it was written."""
    return Mode("ok", content="", finish_reason="content_filter")


def throttled(seconds: float) -> Mode:
    """Azure's 429, with its wait in `retry-after` (whole seconds) and `retry-after-ms`."""
    return Mode("throttled", seconds=seconds)


class _AzureChat(_ChatShape):
    """Chat answers with Azure's content filter results."""

    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        answer = super().whole(body, pieces, mode)
        for choice in answer["choices"]:
            choice["content_filter_results"] = _results(mode)
        return {**answer, "prompt_filter_results": _prompt_results()}

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        events = super().events(body, pieces, mode)
        for event in events:
            for choice in event["choices"]:
                choice["content_filter_results"] = {} if "role" in choice["delta"] \
                    else _results(mode)
        # Azure's first chunk: the prompt's filter results, no choices, blank id and model.
        first = {"choices": [], "created": 0, "id": "", "model": "", "object": "",
                 "prompt_filter_results": _prompt_results()}
        return [first, *events]


def _results(mode: Mode) -> dict[str, Any]:
    return FILTERED if mode.finish_reason == "content_filter" else SAFE


def _prompt_results() -> list[dict[str, Any]]:
    return [{"prompt_index": 0, "content_filter_results": SAFE}]


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None
          ) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


@dataclass
class FakeAzure(FakeUpstream):
    """An Azure OpenAI resource serving `deployments` to holders of `key` or of a token in
    `tokens`; `base_url` is the resource's endpoint (no /v1)."""

    key: str = "azure-test-key-0123456789abcdef"
    deployments: tuple[str, ...] = ("gpt-4o-deploy", "embed-deploy")
    tokens: set[str] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/openai/deployments/{deployment}/{endpoint:.+}", self._deployment)

    async def _deployment(self, request: web.Request) -> web.StreamResponse:
        endpoint = request.match_info["endpoint"]
        refusal = self._refused(request, endpoint)
        if refusal is not None:
            await self._record(request)
            return refusal
        shape = _AzureChat() if endpoint == "chat/completions" else ENDPOINTS[endpoint]()
        return await self._answer(request, shape)

    def _refused(self, request: web.Request, endpoint: str) -> web.Response | None:
        """Azure's answer to a request it refuses before any model sees it, else None."""
        version = request.query.get("api-version")
        if endpoint not in ENDPOINTS or version is None:
            return _json(404, NOT_FOUND)
        if version not in API_VERSIONS:
            return _json(400, BAD_VERSION)
        bearer = request.headers.get("Authorization", "")
        if "api-key" in request.headers or not bearer:
            if request.headers.get("api-key") != self.key:
                return _json(401, BAD_KEY)
        elif bearer.removeprefix("Bearer ") not in self.tokens:
            return _json(401, BAD_TOKEN)
        if request.match_info["deployment"] not in self.deployments:
            return _json(404, NO_DEPLOYMENT)
        return None

    async def _play(self, request: web.Request, mode: Mode, body: dict[str, Any],
                    shape: _Shape) -> web.StreamResponse:
        if mode.kind == "throttled":
            message = ("Requests to the ChatCompletions_Create Operation under Azure OpenAI API "
                       "version 2024-10-21 have exceeded token rate limit of your current "
                       f"OpenAI S0 pricing tier. Please retry after {mode.seconds:g} seconds.")
            return _json(429, {"error": {"code": "429", "message": message}},
                         {"retry-after": str(max(1, round(mode.seconds))),
                          "retry-after-ms": str(round(mode.seconds * 1000))})
        return await super()._play(request, mode, body, shape)


@dataclass
class FakeEntra(FakeUpstream):
    """Microsoft Entra ID's token endpoint, `/{tenant}/oauth2/v2.0/token`, for one app
    registration (`client_id`, `client_secret`); each token it issues is added to `azure`'s.
    Served over TLS (`tls`), as Entra ID is: azure-identity speaks only HTTPS to it."""

    tenant_id: str = "11111111-2222-3333-4444-555555555555"
    client_id: str = "app-client-id"
    client_secret: str = "entra-client-secret-abcdef0123"
    azure: FakeAzure | None = None
    expires_in: int = 3599
    issued: list[str] = field(default_factory=list)

    @property
    def authority(self) -> str:
        """What `"entra": {"authority": …}` names, as for a sovereign cloud's Entra ID."""
        return f"https://localhost:{self.port}"

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self._token)

    async def _token(self, request: web.Request) -> web.Response:
        await self._record(request)
        form = await request.post()
        if request.match_info["tenant"] != self.tenant_id:
            return _json(400, {"error": "invalid_tenant", "error_description":
                               f"AADSTS90002: Tenant '{request.match_info['tenant']}' not found."})
        if form.get("grant_type") != "client_credentials" or form.get("client_id") != \
                self.client_id or form.get("client_secret") != self.client_secret:
            return _json(401, {"error": "invalid_client", "error_description":
                               "AADSTS7000215: Invalid client secret provided. Ensure the "
                               "secret being sent in the request is the client secret value, "
                               "not the client secret ID."})
        if form.get("scope") != "https://cognitiveservices.azure.com/.default":
            return _json(400, {"error": "invalid_scope",
                               "error_description": "AADSTS70011: The provided value for the "
                               "input parameter 'scope' is not valid."})
        token = f"entra-token-{uuid.uuid4().hex}"
        self.issued.append(token)
        if self.azure is not None:
            self.azure.tokens.add(token)
        return _json(200, {"token_type": "Bearer", "expires_in": self.expires_in,
                           "ext_expires_in": self.expires_in,
                           "expires_on": int(time.time()) + self.expires_in,
                           "access_token": token})


def tls_context(ca: Any) -> ssl.SSLContext:
    """A server context with a certificate for localhost from a `trustme.CA`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    return context
