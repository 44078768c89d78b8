"""What the guardrails did since this process started, for `/status.json` and its page."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core.settings import Snapshot


class Tally:
    """Values met per guardrail, category and action; it outlives config snapshots."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], int] = {}

    def add(self, guardrail: str, category: str, action: str, count: int) -> None:
        at = (guardrail, category, action)
        self._counts[at] = self._counts.get(at, 0) + count

    def view(self, snapshot: Snapshot) -> list[dict[str, Any]]:
        """Each configured guardrail: what it detects, its action and phases, the aliases it
        is attached to, and what it did here."""
        attached: dict[str, list[str]] = {}
        for alias, policy in snapshot.policies.items():
            for name in policy.guardrails:
                attached.setdefault(name, []).append(alias)
        return [{"name": name, "action": policy.action, "phases": list(policy.sides),
                 "detect": [*policy.detect, *policy.patterns, *(["words"] if policy.words
                                                                 else []),
                            *([f"judge:{policy.judge.alias}"] if policy.judge else [])],
                 "aliases": sorted(attached.get(name, ())),
                 "actions": _of(self._counts, name)}
                for name, policy in snapshot.guardrails.items()]


def _of(counts: Mapping[tuple[str, str, str], int], name: str) -> dict[str, int]:
    """`{"pseudonymize:EMAIL": 3, ...}` for one guardrail."""
    return {f"{action}:{category}": count
            for (guardrail, category, action), count in sorted(counts.items())
            if guardrail == name}
