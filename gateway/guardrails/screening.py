"""What the guardrails do to one request: its text screened, its values replaced, and the
placeholders given back (pure, beside the stage's I/O).

A `Screening` lives as long as its request. It holds the request's pseudonyms (one value, one
placeholder, across every message and tool call of the request: `[EMAIL_1]`, numbered from 1
per category), and the actions taken, counted per guardrail, category and action. It never
holds a matched text anywhere it could leave: a block names the guardrail and the category.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from gateway.guardrails.detectors import Found, apart
from gateway.guardrails.policies import Guardrail
from providers.contract.errors import ClientError

# Where a placeholder may stand: its category, `_`, its number.
PLACEHOLDER = re.compile(r"\[([A-Z][A-Z0-9_]{0,39}_[1-9][0-9]{0,5})\]")
# The longest a placeholder can be; a stream holds back no more than this.
MAX_PLACEHOLDER = 64
# Fields whose strings are names, ids or settings the gateway never screens: they carry no
# user text, and rewriting them would change what the request means.
_NAMES = frozenset(("model", "role", "type", "id", "object", "tool_call_id", "tool_use_id",
                    "call_id", "item_id", "name", "encoding_format", "service_tier",
                    "reasoning_effort", "previous_response_id", "signature", "finish_reason",
                    "stop_reason", "status"))
# Strings of JSON in JSON: a value put back there is written as JSON writes it.
_JSON_TEXT = frozenset(("arguments", "partial_json"))

Taken = dict[tuple[str, str, str], int]  # (guardrail, category, action) -> values


class GuardrailViolation(ClientError):
    """A guardrail blocked the request, or the answer. The message names the guardrail and
    the category, never what matched."""

    code = "guardrail_violation"

    @classmethod
    def of(cls, guardrail: str, category: str, phase: str) -> GuardrailViolation:
        """The refusal of guardrail `guardrail` finding `category` on `phase`'s side."""
        where = "request" if phase == "input" else "answer"
        held = "was not passed by its judge" if category == "JUDGE" else f"holds {category}"
        return cls(f"Blocked by guardrail '{guardrail}': the {where} {held}",
                   guardrail=guardrail, category=category)

    def __init__(self, message: str, *, guardrail: str = "", category: str = "") -> None:
        super().__init__(message)
        self.guardrail, self.category = guardrail, category


class Screening:
    """One request's pseudonyms and the actions its guardrails took. Names and places are
    looked for only by a screening made `off_loop` (in `gateway.guardrails.entities`' worker
    thread): a model never runs on the event loop."""

    __slots__ = ("_numbers", "off_loop", "originals", "placeholders", "taken")

    def __init__(self, off_loop: bool = False) -> None:
        self.placeholders: dict[str, str] = {}  # value -> its placeholder
        self.originals: dict[str, str] = {}  # placeholder's inside (EMAIL_1) -> value
        self.taken: Taken = {}
        self.off_loop = off_loop
        self._numbers: dict[str, int] = {}

    def took(self, guardrail: Guardrail, category: str, count: int, action: str = "") -> None:
        """`count` values of `category` met by `guardrail` (under `action`, its own unless
        said)."""
        at = (guardrail.name, category, action or guardrail.action)
        self.taken[at] = self.taken.get(at, 0) + count

    def adopt(self, other: Screening) -> None:
        """`other`'s pseudonyms and actions made this one's (a request screened in the worker
        thread, handed back once that is over)."""
        self.placeholders, self.originals = other.placeholders, other.originals
        self.taken, self._numbers = other.taken, other._numbers

    def placeholder(self, value: str, category: str) -> str:
        """The placeholder of `value`: the one it has in this request, else the next."""
        found = self.placeholders.get(value)
        if found is None:
            number = self._numbers.get(category, 0) + 1
            self._numbers[category] = number
            found = self.placeholders[value] = f"[{category}_{number}]"
            self.originals[found[1:-1]] = value
        return found

    # -- the request ---------------------------------------------------------------------

    def screened(self, text: str, guardrails: Sequence[Guardrail], phase: str) -> str:
        """`text` as it may pass `phase`'s side: a block raised, values masked or replaced by
        placeholders (on output, placeholders are never made: they are given back)."""
        for guardrail in guardrails:
            found = guardrail.detector.find(text)
            if guardrail.entities is not None and self.off_loop:
                found = apart(sorted(found + guardrail.entities.find(text)))
            if not found:
                continue
            if guardrail.action == "block":
                self.took(guardrail, found[0].category, 1)
                raise GuardrailViolation.of(guardrail.name, found[0].category, phase)
            for category in {f.category for f in found}:
                self.took(guardrail, category, sum(f.category == category for f in found))
            if guardrail.action == "mask":
                text = _replaced(text, found, lambda _, category: f"[{category}]")
            elif guardrail.action == "pseudonymize" and phase == "input":
                text = _replaced(text, found, self.placeholder)
        return text

    def request(self, body: Any, guardrails: Sequence[Guardrail]) -> Any:
        """A request body's every text screened on the input side; `body` itself when
        nothing in it changed."""
        return walk(body, lambda text, _: self.screened(text, guardrails, "input"))

    # -- the answer ----------------------------------------------------------------------

    def restored(self, text: str, as_json: bool = False) -> str:
        """`text` with this request's placeholders given back (JSON-escaped `as_json`, in a
        string of JSON such as a tool call's arguments)."""
        if not self.originals or "[" not in text:
            return text
        originals = self.originals

        def back(match: re.Match[str]) -> str:
            value = originals.get(match[1])
            if value is None:
                return match[0]
            return msgspec.json.encode(value).decode()[1:-1] if as_json else value

        return PLACEHOLDER.sub(back, text)

    def answer(self, body: Any, guardrails: Sequence[Guardrail]) -> Any:
        """A whole answer's every text screened on the output side (on the text the provider
        wrote, so a value given back is never judged), then its placeholders given back."""
        return walk(body, lambda text, key: self.restored(
            self.screened(text, guardrails, "output") if guardrails else text,
            key in _JSON_TEXT))

    def actions(self) -> list[str]:
        """Each action taken, with its guardrail and the values it replaced
        (`pseudonymize:pii=2`, `block:no-secrets`, `log:audit=1`): the request log's."""
        counts: dict[tuple[str, str], int] = {}
        for (guardrail, _, action), count in self.taken.items():
            counts[(action, guardrail)] = counts.get((action, guardrail), 0) + count
        return [f"{action}:{guardrail}" if action == "block" else f"{action}:{guardrail}={count}"
                for (action, guardrail), count in counts.items()]

    def header(self) -> str:
        """`x-llms-guardrails`: the actions taken, comma-separated."""
        return ", ".join(self.actions())


def text_size(body: Any) -> int:
    """How many characters of `body` (decoded JSON) a guardrail reads."""
    total = 0

    def count(text: str, _: str | None) -> str:
        nonlocal total
        total += len(text)
        return text

    walk(body, count)
    return total


def _replaced(text: str, found: Sequence[Found], by: Callable[[str, str], str]) -> str:
    """`text` with each found value replaced by `by(value, category)`."""
    parts, at = [], 0
    for item in found:
        parts += [text[at:item.start], by(text[item.start:item.end], item.category)]
        at = item.end
    parts.append(text[at:])
    return "".join(parts)


def walk(value: Any, change: Callable[[str, str | None], str], key: str | None = None,
         names: frozenset[str] = _NAMES) -> Any:
    """`value` (decoded JSON) with `change(text, its key)` applied to every string but those
    under `names` (an API's names and ids) and data URLs; the same objects where nothing
    changed."""
    if isinstance(value, str):
        if key in names or value.startswith("data:"):
            return value
        return change(value, key)
    if isinstance(value, dict):
        changed = None
        for name, item in value.items():
            new = walk(item, change, name, names)
            if new is not item:
                if changed is None:
                    changed = dict(value)
                changed[name] = new
        return value if changed is None else changed
    if isinstance(value, list):
        items = None
        for at, item in enumerate(value):
            new = walk(item, change, key, names)
            if new is not item:
                if items is None:
                    items = list(value)
                items[at] = new
        return value if items is None else items
    return value
