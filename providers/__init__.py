"""Provider kinds: one module per kind, found through the `llms_gateway.providers` entry points.

The core never imports a kind by name: `load_kinds()` maps each `type` in llms.json to the class
that serves it, built-in kinds registering through the same entry-point group a third-party
plug-in would use.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    """Every provider kind available: built-ins plus installed plug-ins (which may override)."""
    targets = dict(_BUILTIN)
    targets.update({ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)})
    return {name: _resolve(target) for name, target in targets.items()}


def _resolve(target: str) -> type[Provider]:
    module, _, attr = target.partition(":")
    cls = getattr(import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise TypeError(f"{target} is not a Provider subclass")
    return cls
