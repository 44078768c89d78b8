"""Provider kinds: one module per kind, found through the `llms_gateway.providers` entry points.

The core never imports a kind by name: `load_kinds()` maps each `type` in llms.json to the class
that serves it, built-in kinds registering through the same entry-point group a third-party
plug-in would use.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from importlib import import_module
from importlib.metadata import entry_points

from providers.contract.provider import Provider

ENTRY_POINT_GROUP = "llms_gateway.providers"

# The same pairs pyproject.toml declares; used when the package runs from a source tree that was
# never installed, so a checkout still works.
_BUILTIN = {"openai": "providers.kinds.openai:OpenAIProvider",
            "anthropic": "providers.kinds.anthropic:AnthropicProvider",
            "google": "providers.kinds.google:GoogleProvider",
            "ollama": "providers.kinds.ollama:OllamaProvider",
            "pool": "providers.kinds.pool.provider:PoolProvider",
            "azure": "providers.kinds.azure:AzureProvider",
            "bedrock": "providers.kinds.bedrock:BedrockProvider",
            "vertex": "providers.kinds.vertex:VertexProvider"}


def load_kinds() -> Mapping[str, type[Provider]]:
    """Every provider kind available: built-ins plus installed plug-ins (which may override),
    each imported when first used, so a gateway carries only the kinds its config names."""
    targets = dict(_BUILTIN)
    targets.update({ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)})
    return Kinds(targets)


class Kinds(Mapping[str, type[Provider]]):
    """Kind names to their classes, each module imported on its first lookup."""

    def __init__(self, targets: Mapping[str, str]) -> None:
        self._targets = dict(targets)
        self._loaded: dict[str, type[Provider]] = {}

    def __getitem__(self, name: str) -> type[Provider]:
        if name not in self._loaded:
            self._loaded[name] = _resolve(self._targets[name])
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def __iter__(self) -> Iterator[str]:
        return iter(self._targets)

    def __len__(self) -> int:
        return len(self._targets)


def _resolve(target: str) -> type[Provider]:
    module, _, attr = target.partition(":")
    cls = getattr(import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise TypeError(f"{target} is not a Provider subclass")
    return cls
