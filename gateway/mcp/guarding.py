"""The guardrails of a tool call: its arguments screened before its server sees them, its
result screened and given back the values its arguments had (`gateway.guardrails.values`).

The guardrails in force are the calling key's and its team's (`Account.guardrails`): a tool
call has no alias. They are compiled once per config snapshot, and only when llms.json has a
guardrail at all, so a gateway without one pays nothing here.
"""

from __future__ import annotations

from typing import Any

from gateway.core.call import Identity
from gateway.core.settings import Snapshot
from gateway.guardrails.entities import Models
from gateway.guardrails.policies import Guardrail, Guardrails
from gateway.guardrails.screening import Screening
from gateway.guardrails.tally import Tally
from gateway.guardrails.values import screen_value
from gateway.observe.metrics import Metrics


class ToolGuard:
    """The guardrails of the live snapshot, compiled for tool calls (once per snapshot)."""

    __slots__ = ("_compiled", "_models")

    def __init__(self, models: Models) -> None:
        self._models = models
        self._compiled: tuple[Snapshot, Guardrails] | None = None

    def in_force(self, snapshot: Snapshot, identity: Identity | None
                 ) -> tuple[Guardrail, ...]:
        """The guardrails a call by `identity` passes: its key's and team's."""
        if not snapshot.guardrails:  # first: a configured key has no `guardrails` field
            return ()
        named: tuple[str, ...] = getattr(identity, "guardrails", ())
        if not named:
            return ()
        compiled = self._compiled
        if compiled is None or compiled[0] is not snapshot:
            compiled = self._compiled = (snapshot, Guardrails(snapshot, self._models))
        return compiled[1].in_force("", named)


class ToolScreen:
    """One tool call's screening: its arguments on the way in, its result on the way out."""

    __slots__ = ("guardrails", "screening")

    def __init__(self, guardrails: tuple[Guardrail, ...]) -> None:
        self.guardrails = guardrails
        self.screening = Screening()

    def arguments(self, arguments: dict[str, Any] | None) -> dict[str, Any] | None:
        """The arguments as the tool's server may see them; GuardrailViolation on a block."""
        if arguments is None:
            return None
        screened, _ = screen_value(arguments, self.guardrails, "input", self.screening)
        return dict(screened)

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        """The result as the client may see it, its placeholders given back;
        GuardrailViolation on a block."""
        screened, _ = screen_value(result, self.guardrails, "output", self.screening)
        return dict(screened)

    def header(self) -> str:
        """The actions taken, as `x-llms-guardrails` spells them ('' when none)."""
        return self.screening.header() if self.screening.taken else ""

    def publish(self, metrics: Metrics, tally: Tally) -> None:
        """The actions taken, told once: Prometheus and the status page's counts."""
        for (guardrail, category, action), count in self.screening.taken.items():
            metrics.guardrail(guardrail, category, action, count)
            tally.add(guardrail, category, action, count)
        self.screening.taken = {}
