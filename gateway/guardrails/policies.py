"""The guardrails of one config snapshot, compiled, and those in force for one request.

A policy of llms.json's `guardrails` is compiled once per snapshot (`Guardrail`: its detectors
as one regex); a request passes the union of its alias's, its key's and its team's, blocking
policies first so that a block is judged on the text as the client sent it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gateway.core.settings import Snapshot
from gateway.core.settings.guardrails import GuardrailPolicy, Judge
from gateway.guardrails.detectors import Detector
from gateway.guardrails.entities import Entities, Models
from providers.contract.transport import DEFAULT_MAX_ANSWER_BYTES

Action = Literal["block", "mask", "pseudonymize", "log"]
Phase = Literal["input", "output"]


@dataclass(frozen=True, slots=True)
class Guardrail:
    """One policy as a request meets it: its detectors, the named-entity model it asks (run
    off the event loop by the stage), and the model that judges (read by the stage,
    `gateway.guardrails.judges`)."""

    name: str
    action: Action
    phases: frozenset[Phase]
    detector: Detector
    policy: GuardrailPolicy = field(repr=False)
    judge: Judge | None = None
    entities: Entities | None = None

    @property
    def on_input(self) -> bool:
        return "input" in self.phases

    @property
    def on_output(self) -> bool:
        return "output" in self.phases


def compiled(name: str, policy: GuardrailPolicy, models: Models | None = None) -> Guardrail:
    """`policy` made ready for requests: its detectors as one regex, its named-entity model
    loading (when it asks for one)."""
    entities = None
    if policy.entities:
        entities = Entities(policy.entities, policy.ner, models or Models())
    return Guardrail(name, policy.action, frozenset(policy.sides),
                     Detector(policy.detect, policy.patterns, policy.words, policy.region),
                     policy, policy.judge, entities)


class Guardrails:
    """A snapshot's guardrails: each compiled once, and the set in force per request."""

    __slots__ = ("_aliases", "_bounds", "_in_force", "models", "policies")

    def __init__(self, snapshot: Snapshot, models: Models | None = None) -> None:
        # The process's named-entity models (`Runtime.entity_models`); a script's own if none.
        self.models = models = models or Models()
        self.policies: Mapping[str, Guardrail] = {
            name: compiled(name, policy, models) for name, policy in snapshot.guardrails.items()}
        self._aliases = {alias: policy.guardrails for alias, policy in snapshot.policies.items()
                         if policy.guardrails}
        # Bounded: names come from llms.json alone, so there are few distinct unions.
        self._in_force: dict[tuple[str, ...], tuple[Guardrail, ...]] = {}
        most = {spec.name: spec.max_answer_bytes for spec in snapshot.providers}
        self._bounds = {alias: max((most.get(route.provider, DEFAULT_MAX_ANSWER_BYTES)
                                    for route in routes), default=DEFAULT_MAX_ANSWER_BYTES)
                        for alias, routes in snapshot.routes.items()}

    def answer_bound(self, alias: str) -> int:
        """The most bytes of an answer to `alias` held whole (for an output judge): the
        largest whole answer its providers may give (`max_answer_bytes`)."""
        return self._bounds.get(alias, DEFAULT_MAX_ANSWER_BYTES)

    def in_force(self, alias: str, named: Iterable[str] = ()) -> tuple[Guardrail, ...]:
        """The guardrails a request to `alias` passes, with those its key and team name
        (`named`); a name the snapshot no longer has is skipped."""
        names = tuple(dict.fromkeys((*self._aliases.get(alias, ()), *named)))
        if not names:
            return ()
        found = self._in_force.get(names)
        if found is None:
            chosen = [self.policies[name] for name in names if name in self.policies]
            found = self._in_force[names] = tuple(
                sorted(chosen, key=lambda guardrail: guardrail.action != "block"))
        return found


def configured(snapshot: Snapshot) -> bool:
    """Whether any guardrail is configured: keys and teams may only name the file's, so
    without one no request can meet any, and the stage is not built."""
    return bool(snapshot.guardrails)
