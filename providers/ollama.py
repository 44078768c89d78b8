"""`"type": "ollama"`: a local Ollama through its OpenAI-compatible API, models from /api/tags."""

from __future__ import annotations

from dataclasses import replace

from providers.contract.spec import ProviderSpec
from providers.contract.transport import Transport
from providers.openai import OpenAIProvider

DEFAULT_BASE_URL = "http://127.0.0.1:11434/v1"


class OllamaProvider(OpenAIProvider):
    """Ollama speaks OpenAI at /v1; its own /api/tags lists what is pulled."""

    kind = "ollama"

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        if not spec.base_url:
            spec = replace(spec, base_url=DEFAULT_BASE_URL)
        super().__init__(spec, transport)

    async def list_models(self) -> list[str]:
        root = self._base_url.removesuffix("/v1")
        listing = await self.http.get_json(f"{root}/api/tags")
        return [str(m["name"]) for m in listing.get("models") or () if isinstance(m, dict)
                and "name" in m]
