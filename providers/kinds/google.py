"""`"type": "google"`: chat completions translated to Gemini's `generateContent` and back.

Translation is pure: the request in `google_request` (`to_gemini`, `clean_schema`), the answer
and the stream in `google_stream`, embeddings here; the provider only sends. The key travels in
the `x-goog-api-key` header, never in a URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import aclosing, contextmanager
from typing import Any
from urllib.parse import quote

import msgspec

from providers.contract import embeddings
from providers.contract.errors import BadUpstreamResponse, ProviderRejected, UpstreamClientError
from providers.contract.provider import Outgoing, Provider, Reply
from providers.contract.spec import ProviderSpec
from providers.contract.translate import translated
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds.google_request import request_body
from providers.kinds.google_stream import StreamTranslator, to_chat_completion
from providers.wire.http import HttpUpstream

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
MAX_LIST_PAGES = 20
MAX_EMBEDDING_BATCH = 100  # requests per batchEmbedContents call, Gemini's documented limit
# Gemini answers a bad key with 400 INVALID_ARGUMENT: that is our config, not the client's fault.
KEY_ERRORS = ("API key not valid", "API key expired")


def model_ids(listing: Any) -> list[str]:
    """Ids of the listed models that can answer `generateContent`, without `models/`."""
    models = listing.get("models") if isinstance(listing, dict) else None
    return [str(m["name"]).removeprefix("models/") for m in models or ()
            if isinstance(m, dict) and isinstance(m.get("name"), str)
            and "generateContent" in (m.get("supportedGenerationMethods") or ())]


def to_batch_embed(body: Mapping[str, Any], texts: list[str], name: str) -> dict[str, Any]:
    """The `batchEmbedContents` body for an OpenAI embeddings body: one request per input."""
    dimensions = body.get("dimensions")
    return {"requests": [{"model": name, "content": {"parts": [{"text": text}]},
                          **({"outputDimensionality": dimensions} if dimensions else {})}
                         for text in texts]}


class _Values(msgspec.Struct):
    values: list[float]


class _Embedded(msgspec.Struct):
    embeddings: list[_Values]


def from_batch_embed(payload: bytes, texts: list[str], model: str,
                     encoding_format: str | None) -> dict[str, Any]:
    """OpenAI's embedding list for a `batchEmbedContents` answer. Gemini reports no token
    count for embeddings: usage is estimated from the text (docs/api.md says so)."""
    try:
        embedded = msgspec.json.decode(payload, type=_Embedded)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not a batchEmbedContents answer: {exc}"
                                  ) from None
    embeddings.check_count(len(embedded.embeddings), len(texts))
    return embeddings.embedding_list([e.values for e in embedded.embeddings], model,
                                     embeddings.estimated_tokens(texts), encoding_format)


def chat_reply(payload: bytes, upstream_model: str) -> Reply:
    """The chat completion, with its usage, for a whole `generateContent` answer."""
    try:
        answer = msgspec.json.decode(payload)
    except msgspec.DecodeError as exc:
        raise BadUpstreamResponse(f"response is not JSON: {exc}") from None
    if not isinstance(answer, dict):
        raise BadUpstreamResponse("response is not a JSON object")
    completion = to_chat_completion(answer, upstream_model)
    return Reply(msgspec.json.encode(completion),
                 usage=msgspec.convert(completion["usage"], Usage))


@contextmanager
def _key_rejections() -> Iterator[None]:
    try:
        yield
    except UpstreamClientError as exc:
        if exc.status == 400 and exc.message.startswith(KEY_ERRORS):
            raise ProviderRejected(exc.message, upstream_status=400) from None
        raise


class GoogleProvider(Provider):
    """Google's Gemini API behind the OpenAI chat-completions interface."""

    kind = "google"
    endpoints = frozenset({"chat/completions", "embeddings"})
    embedding_batch = MAX_EMBEDDING_BATCH

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        super().__init__(spec, transport)
        self._base_url = (spec.base_url or DEFAULT_BASE_URL).rstrip("/")
        headers = {"Content-Type": "application/json", **spec.headers}
        secret = spec.api_key.reveal() if spec.api_key else None
        if secret:
            headers["x-goog-api-key"] = secret
        self.http = HttpUpstream(spec.name, spec.timeouts, headers, secret, transport,
                                 spec.link_for(self._base_url))

    def credentials(self) -> Mapping[str, str]:
        return self.http.credentials()

    def _url(self, upstream_model: str, method: str) -> str:
        # "gemini-2.5-flash" and "models/gemini-2.5-flash" alike; a tuned model keeps its prefix.
        name = upstream_model if "/" in upstream_model else f"models/{upstream_model}"
        return f"{self._base_url}/{quote(name, safe='/')}:{method}"

    def _body(self, request: Outgoing) -> bytes:
        return request_body(request, self.spec)

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint == "embeddings":
            return await self._embed(request, upstream_model)
        with _key_rejections():
            payload, _ = await self.http.post(self._url(upstream_model, "generateContent"),
                                              self._body(request))
        return chat_reply(payload, upstream_model)

    async def _embed(self, request: Outgoing, upstream_model: str) -> Reply:
        body = request.json()
        texts = embeddings.texts(body, self.name)
        name = upstream_model if "/" in upstream_model else f"models/{upstream_model}"
        with _key_rejections():
            payload, _ = await self.http.post(self._url(upstream_model, "batchEmbedContents"),
                                              msgspec.json.encode(to_batch_embed(body, texts,
                                                                                 name)))
        listed = from_batch_embed(payload, texts, request.model, body.get("encoding_format"))
        return Reply(msgspec.json.encode(listed), usage=msgspec.convert(listed["usage"], Usage))

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        chunks = self.http.stream(self._url(upstream_model, "streamGenerateContent") + "?alt=sse",
                                  self._body(request))
        with _key_rejections():
            async with aclosing(translated(chunks, StreamTranslator(upstream_model))) as out:
                async for piece in out:
                    yield piece

    async def list_models(self) -> list[str]:
        ids: list[str] = []
        token: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = f"&pageToken={quote(token)}" if token else ""
            listing = await self.http.get_json(f"{self._base_url}/models?pageSize=1000{page}")
            ids += model_ids(listing)
            token = listing.get("nextPageToken") if isinstance(listing, dict) else None
            if not token:
                break
        return ids
