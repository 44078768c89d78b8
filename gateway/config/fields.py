"""One field of llms.json checked: a section merged over its base, every error naming the file and
the field."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from gateway.core.settings import ConfigError

S = TypeVar("S", bound=msgspec.Struct)

_UNKNOWN = re.compile(r"Object contains unknown field `([^`]+)`")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def invalid(file: str, field: str, exc: msgspec.ValidationError,
            within: type[msgspec.Struct] | None = None) -> ConfigError:
    """A ConfigError reading "FILE: dotted.field: problem" from a msgspec error; an unknown
    field in a `within` object is given the closest known name."""
    # msgspec says "Expected `int`, got `str` - at `$.timeouts.connect`"; lead with the field.
    problem, _, at = str(exc).partition(" - at `$")
    at = at.rstrip("`")
    if within is not None and (unknown := _UNKNOWN.fullmatch(problem)):
        problem += did_you_mean(unknown[1], _fields_at(msgspec.inspect.type_info(within), at))
    path = ".".join(part for part in (field, at.lstrip(".")) if part)
    return ConfigError(f"{file}: {path}: {problem}" if path else f"{file}: {problem}")


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """" (did you mean `x`?)" for the known name closest to a typo, or nothing."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def unknown_fields(raw: Mapping[str, Any], known: frozenset[str], where: str) -> list[str]:
    """"where.name: unknown field (did you mean ...)" for each field of `raw` not `known`."""
    return [f"{where}.{name}: unknown field{did_you_mean(name, known)}"
            for name in raw if name not in known]


def _fields_at(info: msgspec.inspect.Type, at: str) -> frozenset[str]:
    """The field names of the object at `at` ("$"-relative, as msgspec writes it) in `info`."""
    for name, _ in _STEP.findall(at):
        info = _inner(info, name or None)
    info = _inner(info, None)
    if isinstance(info, msgspec.inspect.StructType):
        return frozenset(f.encode_name for f in info.fields)
    return frozenset()


def _inner(info: msgspec.inspect.Type, name: str | None) -> msgspec.inspect.Type:
    """One step down: a struct's field `name`, a container's items (`name` None for an index or
    a key, which reach the same type); through unions, to the first object among them."""
    if isinstance(info, msgspec.inspect.UnionType):
        objects = [t for t in info.types if isinstance(t, (msgspec.inspect.StructType,
                                                           msgspec.inspect.DictType))]
        info = objects[0] if objects else info
    if isinstance(info, msgspec.inspect.StructType):
        found = [f.type for f in info.fields if f.encode_name == name]
        return found[0] if found else info
    if isinstance(info, msgspec.inspect.DictType):
        return info.value_type
    if isinstance(info, (msgspec.inspect.ListType, msgspec.inspect.VarTupleType,
                         msgspec.inspect.SetType, msgspec.inspect.FrozenSetType)):
        return info.item_type
    return info


def merge_over(base: S, overrides: Mapping[str, Any], file: str, field: str) -> S:
    """`overrides` over `base`, checked as `field` of `file`; durations and counts above 0."""
    try:
        merged = msgspec.convert({**msgspec.structs.asdict(base), **overrides}, type(base))
    except msgspec.ValidationError as exc:
        raise invalid(file, field, exc, type(base)) from exc
    for name in ("connect", "first_token", "idle", "total", "attempts", "failures",
                 "window", "open_for"):
        value = getattr(merged, name, None)
        if value is not None and value <= 0:
            raise ConfigError(f"{file}: {field}.{name}: must be greater than 0, got {value}")
    return merged
