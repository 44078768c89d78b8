"""`"type": "vertex"`: Gemini and Claude on Google Cloud's Vertex AI, with OAuth2 access tokens.

The bodies and answers are the `google` kind's (Gemini: `generateContent`) and the `anthropic`
kind's (Claude: Messages, `model` in the URL, `anthropic_version` in the body): their pure
translations are used as they are. What is Vertex's own: the URL (project, location,
publisher), embeddings through `:predict`, and the OAuth2 bearer token (`vertex_auth`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import aclosing, contextmanager
from typing import Any
from urllib.parse import quote

import msgspec

from providers.contract import embeddings
from providers.contract.errors import BadUpstreamResponse, ProviderRejected
from providers.contract.lasting import Lasting
from providers.contract.provider import Outgoing, Provider, Reply
from providers.contract.spec import ProviderSpec
from providers.contract.translate import Translator, translated
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds import anthropic
from providers.kinds import google as gemini
from providers.kinds.anthropic_request import to_messages
from providers.kinds.google_request import request_body
from providers.kinds.google_stream import StreamTranslator
from providers.kinds.vertex_auth import AccessTokens, fingerprint, service_account_credentials
from providers.wire.http import HttpUpstream

DEFAULT_LOCATION = "us-central1"
ANTHROPIC_VERSION = "vertex-2023-10-16"  # what Vertex's Claude endpoints take in the body
MAX_EMBEDDING_BATCH = 250  # instances per `:predict` call for text-embedding models
MAX_TOKEN_ANSWER = 64 * 1024  # a token endpoint's answer is a few hundred bytes
# A location names a host (`{location}-aiplatform.googleapis.com`): nothing else may get in.
LOCATION = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


class VertexSettings(msgspec.Struct, frozen=True):
    """The kind's own fields in llms.json."""

    project: str | None = None  # absent: the service account's, or the environment's
    location: str = DEFAULT_LOCATION
    credentials: str | None = None  # a service account key file; absent: google.auth.default()


def read_settings(raw: Mapping[str, Any]) -> VertexSettings:
    """The kind's fields from its llms.json object; ValueError names a bad one."""
    own = {name: raw[name] for name in VertexSettings.__struct_fields__ if name in raw}
    try:
        settings = msgspec.convert(own, VertexSettings)
    except msgspec.ValidationError as exc:
        problem, _, at = str(exc).partition(" - at `$.")
        raise ValueError(f"{at.rstrip('`')}: {problem}" if at else problem) from None
    if not LOCATION.fullmatch(settings.location):
        raise ValueError(f"location: {settings.location!r} is not a Google Cloud location")
    return settings


def default_base_url(location: str) -> str:
    """Vertex AI's endpoint for a location (`global` has no regional host)."""
    if location == "global":
        return "https://aiplatform.googleapis.com"
    return f"https://{location}-aiplatform.googleapis.com"


def model_url(base_url: str, project: str, location: str, model: str, method: str) -> str:
    """A publisher model's method: Claude ids (`claude-…`) are Anthropic's, the rest Google's."""
    publisher = "anthropic" if is_claude(model) else "google"
    return (f"{base_url}/v1/projects/{quote(project, safe='')}/locations/{location}"
            f"/publishers/{publisher}/models/{quote(model, safe='@')}:{method}")


def is_claude(model: str) -> bool:
    """Whether Vertex serves `model` through Anthropic's Messages API."""
    return model.startswith("claude-")


def to_raw_predict(body: Mapping[str, Any], upstream_model: str,
                   spec: ProviderSpec) -> bytes:
    """The `rawPredict` body for an OpenAI chat body: a Messages request without `model`
    (it is in the URL) and with Vertex's `anthropic_version`."""
    request = to_messages(body, upstream_model)
    del request["model"]
    request["anthropic_version"] = ANTHROPIC_VERSION
    for name in spec.drop_params:
        request.pop(name, None)
    request.update(spec.params)
    return msgspec.json.encode(request)


def to_predict(body: Mapping[str, Any], texts: list[str]) -> dict[str, Any]:
    """The `:predict` body for an OpenAI embeddings body: one instance per input."""
    predict: dict[str, Any] = {"instances": [{"content": text} for text in texts]}
    if dimensions := body.get("dimensions"):
        predict["parameters"] = {"outputDimensionality": dimensions}
    return predict


class _Statistics(msgspec.Struct):
    token_count: float = 0


class _Embedding(msgspec.Struct):
    values: list[float]
    statistics: _Statistics = msgspec.field(default_factory=_Statistics)


class _Prediction(msgspec.Struct):
    embeddings: _Embedding


class _Predicted(msgspec.Struct):
    predictions: list[_Prediction]


def from_predict(payload: bytes, texts: list[str], model: str,
                 encoding_format: str | None) -> dict[str, Any]:
    """OpenAI's embedding list for a `:predict` answer, usage from its token counts."""
    try:
        predicted = msgspec.json.decode(payload, type=_Predicted)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not a predict answer: {exc}") from None
    embeddings.check_count(len(predicted.predictions), len(texts))
    found = [p.embeddings for p in predicted.predictions]
    tokens = int(sum(e.statistics.token_count for e in found))
    return embeddings.embedding_list([e.values for e in found], model, tokens, encoding_format)


class VertexProvider(Provider):
    """Vertex AI's Gemini and Claude models behind the OpenAI chat-completions interface."""

    kind = "vertex"
    endpoints = frozenset({"chat/completions", "embeddings"})
    embedding_batch = MAX_EMBEDDING_BATCH
    fields = frozenset(VertexSettings.__struct_fields__)

    def takes_cache_control(self, upstream_model: str) -> bool:
        """Claude's prompt-cache marks reach it (Gemini's caching is another API)."""
        return is_claude(upstream_model)

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        super().__init__(spec, transport)
        settings = read_settings(spec.raw)
        credentials = None
        if settings.credentials:
            credentials = service_account_credentials(settings.credentials)
        self._project = settings.project or getattr(credentials, "project_id", None)
        self._location = settings.location
        self._base_url = (spec.base_url or default_base_url(settings.location)).rstrip("/")
        self._base_url = self._base_url.removesuffix("/v1")
        headers = {"Content-Type": "application/json", **spec.headers}
        self.http = HttpUpstream(spec.name, spec.timeouts, headers, None, transport,
                                 spec.link_for(self._base_url))
        # A token is part of the wait for the first token: it gets no longer than that.
        self._token_timeout = min(spec.timeouts.first_token, spec.timeouts.total)
        self.tokens = AccessTokens(credentials, self._exchange, self._token_timeout)
        self._fingerprint = fingerprint(settings.credentials)
        self._lasting: Lasting | None = None

    async def start(self, lasting: Lasting) -> None:
        """Take over the tokens of the snapshot before when they come from the same
        credentials: a reload neither mints a new token nor refreshes twice."""
        built = self.tokens

        async def build() -> AccessTokens:
            return built

        self.tokens = await lasting.acquire(f"vertex:{self.name}", self._fingerprint, build)
        self.tokens.use(self._exchange, self._token_timeout)
        self._lasting = lasting

    async def close(self) -> None:
        if self._lasting is not None:
            await self._lasting.release(f"vertex:{self.name}", self.tokens)

    async def _exchange(self, method: str, url: str, body: bytes | None,
                        headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
        """google-auth's requests (the token endpoint), whatever their status."""
        async with asyncio.timeout(self._token_timeout):
            response = await self.transport.request(
                method, url, headers=headers, body=body, link=self.spec.link_for(url),
                connect_timeout=self.spec.timeouts.connect)
            try:
                return response.status, response.headers, await response.read(MAX_TOKEN_ANSWER)
            finally:
                response.close()

    async def _authorized(self, model: str, method: str) -> tuple[str, str, dict[str, str]]:
        token = await self.tokens.token()
        project = self._project or self.tokens.project
        if not project:
            raise ProviderRejected("no project: set `project`, or use credentials that name one")
        # Scrubbed from anything the upstream says back, should it quote the token.
        self.http.secret = token
        headers = {"Authorization": f"Bearer {token}"}
        if quota := self.tokens.quota_project:
            headers["x-goog-user-project"] = quota
        return token, model_url(self._base_url, project, self._location, model, method), headers

    def _body(self, request: Outgoing, upstream_model: str) -> bytes:
        if is_claude(upstream_model):
            return to_raw_predict({**request.json(), "stream": request.stream}, upstream_model,
                                  self.spec)
        return request_body(request, self.spec)

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint == "embeddings":
            return await self._embed(request, upstream_model)
        claude = is_claude(upstream_model)
        token, url, headers = await self._authorized(
            upstream_model, "rawPredict" if claude else "generateContent")
        with self._watching(token):
            payload, _ = await self.http.post(url, self._body(request, upstream_model), headers)
        if claude:
            return anthropic.chat_reply(payload, upstream_model)
        return gemini.chat_reply(payload, upstream_model)

    async def _embed(self, request: Outgoing, upstream_model: str) -> Reply:
        body = request.json()
        texts = embeddings.texts(body, self.name)
        token, url, headers = await self._authorized(upstream_model, "predict")
        with self._watching(token):
            payload, _ = await self.http.post(url, msgspec.json.encode(to_predict(body, texts)),
                                              headers)
        listed = from_predict(payload, texts, request.model, body.get("encoding_format"))
        return Reply(msgspec.json.encode(listed), usage=msgspec.convert(listed["usage"], Usage))

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        claude = is_claude(upstream_model)
        token, url, headers = await self._authorized(
            upstream_model, "streamRawPredict" if claude else "streamGenerateContent")
        if not claude:
            url += "?alt=sse"
        translator: Translator = (anthropic.StreamTranslator(upstream_model) if claude
                                  else StreamTranslator(upstream_model))
        chunks = self.http.stream(url, self._body(request, upstream_model), headers)
        with self._watching(token):
            async with aclosing(translated(chunks, translator)) as out:
                async for piece in out:
                    yield piece

    @contextmanager
    def _watching(self, token: str) -> Iterator[None]:
        """A 401 means Vertex no longer takes `token` (revoked, or expired early): the next
        request gets a new one."""
        try:
            yield
        except ProviderRejected as exc:
            if exc.upstream_status == 401:
                self.tokens.refused(token)
            raise
