"""One field of llms.json checked: a section merged over its base, every error naming the file and
the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from gateway.core.settings import ConfigError

S = TypeVar("S", bound=msgspec.Struct)


def invalid(file: str, field: str, exc: msgspec.ValidationError) -> ConfigError:
    """A ConfigError reading "FILE: dotted.field: problem" from a msgspec error."""
    # msgspec says "Expected `int`, got `str` - at `$.timeouts.connect`"; lead with the field.
    problem, _, at = str(exc).partition(" - at `$")
    path = ".".join(part for part in (field, at.rstrip("`").lstrip(".")) if part)
    return ConfigError(f"{file}: {path}: {problem}" if path else f"{file}: {problem}")


def merge_over(base: S, overrides: Mapping[str, Any], file: str, field: str) -> S:
    """`overrides` over `base`, checked as `field` of `file`; durations and counts above 0."""
    try:
        merged = msgspec.convert({**msgspec.structs.asdict(base), **overrides}, type(base))
    except msgspec.ValidationError as exc:
        raise invalid(file, field, exc) from exc
    for name in ("connect", "first_token", "idle", "total", "attempts", "failures",
                 "window", "open_for"):
        value = getattr(merged, name, None)
        if value is not None and value <= 0:
            raise ConfigError(f"{file}: {field}.{name}: must be greater than 0, got {value}")
    return merged
