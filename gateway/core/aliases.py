"""The names clients send, resolved to the aliases that serve them; fallback chains between aliases.

`models` in llms.json may give a name `"alias_of": "other"` (an alias of an alias works too) and
may use `*` in a key (`"claude-*"`): clients such as Claude Code ask for a new model name with
each release, and a pattern keeps serving them without an edit. An exact name wins over a
pattern, a longer pattern over a shorter one (equal lengths: file order). Everything is checked
and flattened at load, so a request's lookup is one dict get (a pattern a short scan).

`fallbacks` lists the aliases tried after an alias's own candidates failed, for every failure
(a list) or per failure class (`context_window`, `content_policy`, `rate_limit`, `default`).
A fallback alias brings its own chain for the same class after it; each alias is tried once, and
a loop is refused at load (it says the chain is not what its author thought).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

# The classes a failed alias's chain is chosen by (`fallbacks` as an object).
CLASSES = ("context_window", "content_policy", "rate_limit", "default")


class AliasError(ValueError):
    """A `models` entry that cannot be resolved; the message names the field."""


@dataclass(frozen=True, slots=True)
class Names:
    """Requested names → the alias that serves them."""

    exact: Mapping[str, str] = field(default_factory=dict)
    # (pattern, alias), longest pattern first.
    patterns: tuple[tuple[str, str], ...] = ()

    def resolve(self, name: str, served: Collection[str]) -> str:
        """The alias serving `name`: its `alias_of` chain's end, itself when an alias serves it,
        else the longest matching pattern's target, else `name` (unknown: a 404 later)."""
        if (alias := self.exact.get(name)) is not None:
            return alias
        if name in served:
            return name
        for pattern, target in self.patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return target
        return name


def names(alias_of: Mapping[str, str], known: Collection[str], open_ended: bool) -> Names:
    """Resolve `alias_of` entries (model key → target) against the aliases providers serve
    (`known`, disabled providers' included: an unset key must not make the file invalid).
    `open_ended`: a provider discovers its models, so a target may appear later."""
    exact: dict[str, str] = {}
    for name in alias_of:
        exact[name] = _follow(name, alias_of, known, open_ended)
    patterns = [(name, target) for name, target in exact.items() if "*" in name]
    for pattern, _ in patterns:
        del exact[pattern]
    patterns.sort(key=lambda item: -len(item[0]))  # stable: equal lengths keep file order
    return Names(exact, tuple(patterns))


def _follow(name: str, alias_of: Mapping[str, str], known: Collection[str],
            open_ended: bool) -> str:
    seen = [name]
    target = alias_of[name]
    while target in alias_of:
        if target in seen:
            loop = " → ".join([*seen, target])
            raise AliasError(f"models.{name}.alias_of: a loop ({loop})")
        seen.append(target)
        target = alias_of[target]
    if "*" in target:
        raise AliasError(f"models.{seen[-1]}.alias_of: '{target}' is a pattern; name an alias")
    if target not in known and not open_ended:
        raise AliasError(f"models.{seen[-1]}.alias_of: '{target}' is no alias a provider "
                         "serves nor another alias_of")
    return target


@dataclass(frozen=True, slots=True)
class Chains:
    """Per alias and failure class, the aliases to try after its own candidates, in order."""

    chains: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    def after(self, alias: str, failure: str) -> tuple[str, ...]:
        """The aliases to try once `alias`'s candidates failed for `failure` (a class)."""
        return self.chains.get(alias, {}).get(failure, ())


def chains(written: Mapping[str, Mapping[str, tuple[str, ...]]], resolve: Names,
           known: Collection[str], open_ended: bool) -> Chains:
    """Check and flatten `fallbacks` (alias → class → aliases as written): each name resolved,
    known, and no loop through any class's chain."""
    resolved: dict[str, dict[str, tuple[str, ...]]] = {}
    for alias, by_class in written.items():
        source = resolve.resolve(alias, known)
        resolved[source] = {}
        for failure, targets in by_class.items():
            if failure not in CLASSES:
                raise AliasError(f"models.{alias}.fallbacks.{failure}: not a failure class "
                                 f"(one of {', '.join(CLASSES)})")
            ends = []
            for target in targets:
                end = resolve.resolve(target, known)
                if end not in known and not open_ended:
                    raise AliasError(f"models.{alias}.fallbacks: '{target}' is no alias a "
                                     "provider serves")
                ends.append(end)
            resolved[source][failure] = tuple(ends)
    flat = {alias: {failure: _flatten(alias, failure, resolved) for failure in CLASSES}
            for alias in resolved}
    return Chains(flat)


def _flatten(alias: str, failure: str, resolved: Mapping[str, Mapping[str, tuple[str, ...]]],
             path: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`alias`'s chain for `failure`, each fallback followed by its own; AliasError on a loop."""
    path = (*path, alias)
    out: list[str] = []
    for target in _chain_of(resolved.get(alias, {}), failure):
        if target in path:
            loop = " → ".join([*path, target])
            raise AliasError(f"models.{path[0]}.fallbacks: a loop ({loop})")
        out.append(target)
        out.extend(_flatten(target, failure, resolved, path))
    return tuple(_once(out))


def _chain_of(by_class: Mapping[str, tuple[str, ...]], failure: str) -> tuple[str, ...]:
    return by_class.get(failure, by_class.get("default", ()))


def _once(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
