"""`"type": "ollama"`: a local Ollama through its OpenAI-compatible API, models from /api/tags,
embeddings from its native /api/embed (text only; `dimensions` passed on)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import msgspec

from providers.contract import embeddings
from providers.contract.errors import BadUpstreamResponse
from providers.contract.provider import Outgoing, Reply
from providers.contract.spec import ProviderSpec
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds.openai import OpenAIProvider

DEFAULT_BASE_URL = "http://127.0.0.1:11434/v1"


class OllamaProvider(OpenAIProvider):
    """Ollama speaks OpenAI at /v1; its own /api/tags lists what is pulled."""

    kind = "ollama"

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        if not spec.base_url:
            spec = replace(spec, base_url=DEFAULT_BASE_URL)
        super().__init__(spec, transport)

    def continues(self) -> str:
        """A chat ending with an assistant message is continued from it: Ollama's templates
        leave the last message open (its maintainers' answer to "continue last message",
        ollama/ollama#6778); it takes no `continue_final_message`."""
        return "prefill"

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint != "embeddings":
            return await super().send(request, upstream_model)
        body = request.json()
        texts = embeddings.texts(body, self.name)
        answer, _ = await self.http.post(f"{self._root}/api/embed",
                                         msgspec.json.encode(to_embed(body, texts,
                                                                      upstream_model)))
        listed = from_embed(answer, texts, request.model, body.get("encoding_format"))
        return Reply(msgspec.json.encode(listed), usage=msgspec.convert(listed["usage"], Usage))

    @property
    def _root(self) -> str:
        return self._base_url.removesuffix("/v1")

    async def list_models(self) -> list[str]:
        listing = await self.http.get_json(f"{self._root}/api/tags")
        return [str(m["name"]) for m in listing.get("models") or () if isinstance(m, dict)
                and "name" in m]


def to_embed(body: Mapping[str, Any], texts: list[str], upstream_model: str) -> dict[str, Any]:
    """Ollama's `/api/embed` request for an OpenAI embeddings body."""
    request: dict[str, Any] = {"model": upstream_model, "input": texts}
    if body.get("dimensions") is not None:
        request["dimensions"] = body["dimensions"]
    return request


class _Embedded(msgspec.Struct):
    embeddings: list[list[float]]
    prompt_eval_count: int | None = None


def from_embed(answer: bytes, texts: list[str], model: str,
               encoding_format: str | None) -> dict[str, Any]:
    """OpenAI's embedding list for an `/api/embed` answer; a failover if it is not one."""
    try:
        embedded = msgspec.json.decode(answer, type=_Embedded)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not an /api/embed answer: {exc}") from None
    embeddings.check_count(len(embedded.embeddings), len(texts))
    tokens = embedded.prompt_eval_count or embeddings.estimated_tokens(texts)
    return embeddings.embedding_list(embedded.embeddings, model, tokens, encoding_format)
