"""`"type": "openai"`: any OpenAI-compatible server (OpenAI, Lilac, Groq, vLLM, llama.cpp, ...).

The body passes through as bytes when nothing needs changing; otherwise it is rewritten for this
provider: the model id, forced `params`, `drop_params`, a stream's usage request, and the field
spellings it understands (`providers.kinds.compat`). Answers come back normalised the same way.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Coroutine, Mapping
from typing import Any
from urllib.parse import urlencode

import msgspec

from providers.contract import embeddings
from providers.contract.answer import check_json
from providers.contract.provider import Answer, Outgoing, Provider, Reply, decode_body
from providers.contract.spec import ProviderSpec
from providers.contract.stream import flowing
from providers.contract.transport import Transport, UpstreamSocket
from providers.kinds.compat import (
    OPTION_FIELDS,
    OpenAIOptions,
    StreamNormalizer,
    needs_translation,
    normalize_reply,
    read_options,
    translate_request,
    used_legacy_functions,
)
from providers.wire.http import HttpUpstream


def asks_stream_usage(request: Outgoing, options: OpenAIOptions) -> bool:
    """Streams ask for usage (for cost and token limits) unless the client did or config says no."""
    return (request.stream and not request.client_wants_usage and options.stream_usage
            and request.endpoint in ("chat/completions", "completions"))


def build_body(request: Outgoing, upstream_model: str, spec: ProviderSpec,
               options: OpenAIOptions) -> bytes:
    """The upstream body: the client's bytes untouched unless something must change."""
    if request.content_type is not None:  # an upload: only its model field is rewritten
        return request.raw if upstream_model == request.model \
            else request.renamed(upstream_model).raw
    add_usage = asks_stream_usage(request, options)
    translate = request.endpoint == "chat/completions" and needs_translation(request.raw,
                                                                            options)
    if (upstream_model == request.model and not spec.params and not spec.drop_params
            and not add_usage and not translate):
        return request.raw
    if translate:  # translation changes nested messages: work on a fresh copy
        body: dict[str, Any] = translate_request(decode_body(request.raw), options)
    else:  # top-level fields only: the rest goes as it came, not decoded
        body = request.fields()
    body["model"] = upstream_model
    if add_usage:
        asked = body.get("stream_options")
        if isinstance(asked, msgspec.Raw):
            asked = msgspec.json.decode(asked)
        body["stream_options"] = {**(asked or {}), "include_usage": True}
    for name in spec.drop_params:
        body.pop(name, None)
    body.update(spec.params)
    return msgspec.json.encode(body)


def build_headers(spec: ProviderSpec) -> Mapping[str, str]:
    """Headers sent with every request to this provider (`HttpUpstream` chooses the encoding)."""
    headers = {"Content-Type": "application/json", **spec.headers}
    if spec.api_key is not None:
        headers["Authorization"] = f"Bearer {spec.api_key.reveal()}"
    return headers


def ws_url(url: str) -> str:
    """`url` with its scheme for a WebSocket: `https` to `wss`, `http` to `ws`."""
    scheme, sep, rest = url.partition("://")
    return {"https": "wss", "http": "ws"}.get(scheme.lower(), scheme) + sep + rest


# OpenAI's endpoints besides chat (rerank: the Cohere/Jina shape vLLM serves at /v1/rerank),
# relayed as they are; `audio/speech` answers audio bytes, relayed as they come.
NATIVE = frozenset({"moderations", "rerank", "images/generations", "images/edits",
                    "audio/speech", "audio/transcriptions", "audio/translations"})
SPEECH = "audio/speech"


def _typed(request: Outgoing) -> Mapping[str, str] | None:
    """An upload's own Content-Type (its boundary) in place of JSON's."""
    return {"Content-Type": request.content_type} if request.content_type is not None else None


class OpenAIProvider(Provider):
    """An upstream that speaks OpenAI's HTTP API."""

    kind = "openai"
    endpoints = frozenset({"chat/completions", "completions", "embeddings", *NATIVE})
    embedding_batch = embeddings.MAX_INPUTS
    fields = OPTION_FIELDS

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        super().__init__(spec, transport)
        if not spec.base_url:
            raise ValueError(f"provider {spec.name!r} of type openai needs a base_url")
        self._base_url = spec.base_url
        self.http = self.upstream(spec, transport)
        self.options = read_options(spec.raw)
        if self.options.responses:
            self.endpoints = self.endpoints | {"responses"}
        self.native_batches = self.options.batches == "native"

    def upstream(self, spec: ProviderSpec, transport: Transport) -> HttpUpstream:
        """How this provider is reached: its headers and credential (a kind with another
        scheme of authentication overrides it)."""
        return HttpUpstream(spec.name, spec.timeouts, build_headers(spec),
                            spec.api_key.reveal() if spec.api_key else None, transport,
                            spec.link_for(spec.base_url))

    def url(self, endpoint: str, upstream_model: str) -> str:
        """Where `endpoint` is served for `upstream_model` (a kind with another URL scheme
        overrides it)."""
        return f"{self._base_url}/{endpoint}"

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        body, headers = await self.http.post(
            self.url(request.endpoint, upstream_model),
            build_body(request, upstream_model, self.spec, self.options), _typed(request))
        content_type = headers.get("Content-Type", "application/json")
        if request.endpoint in NATIVE and not content_type.startswith("application/json"):
            return Reply(body, content_type)  # a transcript as text, SRT or VTT; audio
        usage = check_json(body)
        if request.endpoint == "embeddings":
            embeddings.check_list(body, len(embeddings.inputs(request.json())))
        elif request.endpoint == "chat/completions":
            body = normalize_reply(body, self._legacy(request))
        return Reply(body, content_type, usage)

    def answer(self, request: Outgoing, upstream_model: str) -> Coroutine[Any, Any, Answer]:
        """Speech is audio bytes, relayed as they come (its first bytes before the try
        counts as answered); every other endpoint as any kind answers it."""
        if request.endpoint != SPEECH:
            return super().answer(request, upstream_model)
        return self._speech(request, upstream_model)

    async def _speech(self, request: Outgoing, upstream_model: str) -> Answer:
        headers, chunks = await self.http.flow(
            self.url(SPEECH, upstream_model),
            build_body(request, upstream_model, self.spec, self.options))
        return await flowing(chunks, headers.get("Content-Type", "application/octet-stream"))

    def credentials(self) -> Mapping[str, str]:
        return self.http.credentials()

    async def realtime(self, upstream_model: str, beta: bool, max_frame_bytes: int
                       ) -> UpstreamSocket:
        """`{base_url}/realtime?model=ID`, with this provider's key (never the client's)."""
        url = f"{self._base_url}/realtime?{urlencode({'model': upstream_model})}"
        return await self.dial(url, await self.realtime_headers(beta), max_frame_bytes)

    async def realtime_headers(self, beta: bool) -> dict[str, str]:
        """The upgrade's headers: credentials, configured headers, the beta protocol's."""
        headers = dict(self.credentials())
        if beta:
            headers["OpenAI-Beta"] = "realtime=v1"
        return headers

    async def dial(self, url: str, headers: Mapping[str, str], max_frame_bytes: int
                   ) -> UpstreamSocket:
        """Open the WebSocket at `url` (an http(s) URL) within `timeouts.connect`."""
        return await self.transport.websocket(
            ws_url(url), headers=headers, link=self.spec.link_for(url),
            connect_timeout=self.spec.timeouts.connect, max_frame_bytes=max_frame_bytes)

    async def batch_api(self, method: str, path: str, body: bytes | None = None,
                        content_type: str = "application/json") -> bytes:
        if not self.native_batches:
            return await super().batch_api(method, path, body, content_type)
        payload, _ = await self.http.call(method, f"{self._base_url}/{path}", body,
                                          {"Content-Type": content_type})
        return payload

    async def list_models(self) -> list[str]:
        listing = await self.http.get_json(f"{self._base_url}/models")
        return [str(m["id"]) for m in listing.get("data") or () if isinstance(m, dict)
                and "id" in m]

    def continues(self) -> str:
        return "continue_final_message" if self.options.continue_final_message \
            else "instruction"

    def _legacy(self, request: Outgoing) -> bool:
        """Did the client use the deprecated functions API that this upstream no longer has?"""
        return (not self.options.legacy_functions and request.raw.find(b'"function') >= 0
                and used_legacy_functions(request.json()))

    def stream(self, request: Outgoing, upstream_model: str) -> AsyncGenerator[bytes, None]:
        url = self.url(request.endpoint, upstream_model)
        body = build_body(request, upstream_model, self.spec, self.options)
        if request.endpoint != "chat/completions":
            return self.http.stream(url, body)
        return self.http.stream(url, body, translator=StreamNormalizer(self._legacy(request)))
