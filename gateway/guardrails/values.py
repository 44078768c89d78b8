"""Guardrails on a JSON value outside a relayed request: an MCP tool's arguments on their way
to its server, its result on the way back (pure; the MCP gateway calls it).

Every string of the value is screened, whatever its key (a tool's `name` argument is the
user's text, not an API's name). On the input side, values are blocked, masked or replaced by
placeholders; on the output side, blocked or masked, and the placeholders of the screening
that made them (one per tool call, or the conversation's) given back. Judges are not asked
here: they need the stack (`gateway.guardrails.judges`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.guardrails.policies import Guardrail, Phase
from gateway.guardrails.screening import Screening, walk

_ANY_KEY: frozenset[str] = frozenset()


def screen_value(value: Any, guardrails: Sequence[Guardrail], phase: Phase,
                 screening: Screening | None = None) -> tuple[Any, Screening]:
    """`value` (decoded JSON, or a text) as it may pass `phase`'s side, and the screening that
    holds its placeholders and the actions taken (`screening`, when given, is carried on: a
    tool's result is given back the values its arguments had). Raises `GuardrailViolation`
    when a guardrail blocks; `value` itself when nothing in it changed."""
    screening = Screening() if screening is None else screening
    if phase == "input":
        side = [g for g in guardrails if g.on_input]
        return walk(value, lambda text, _: screening.screened(text, side, "input"),
                    names=_ANY_KEY) if side else value, screening
    side = [g for g in guardrails if g.on_output and g.action != "pseudonymize"]
    restores = any(g.on_output and g.action == "pseudonymize" for g in guardrails)

    def out(text: str, _: str | None) -> str:
        text = screening.screened(text, side, "output") if side else text
        return screening.restored(text) if restores else text

    return walk(value, out, names=_ANY_KEY), screening
