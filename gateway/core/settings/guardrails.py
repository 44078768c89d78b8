"""Guardrails' settings (`guardrails` in llms.json, `gateway.guardrails`)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

_CATEGORY = re.compile(r"[A-Z][A-Z0-9_]{0,39}")


class Judge(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model as a guardrail's judge: an alias asked whether a request is safe."""

    alias: str
    timeout: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0  # seconds, then `on_error`
    on_error: Literal["block", "allow"] = "block"  # a judge slow, down or unreadable
    # Asked beside the upstream call: the answer is held until the judge passes.
    parallel: bool = False
    # `chat`: a reply starting with `unsafe` (Llama Guard's) is a violation; `moderations`:
    # a `flagged` result is.
    endpoint: Literal["chat", "moderations"] = "chat"


class GuardrailPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of llms.json's `guardrails`: what it detects (or the model that judges), what
    it does with it, and on which side of the call."""

    detect: tuple[Literal["email", "phone", "card", "iban", "ip", "secrets", "national_id"],
                  ...] = ()
    # The operator's own: CATEGORY (its placeholder's name) -> regex; and words, whole and
    # case-insensitive (category WORD).
    patterns: dict[str, str] = {}
    words: tuple[str, ...] = ()
    action: Literal["block", "mask", "pseudonymize", "log"] = "block"
    # None: both sides, or the input alone for a judge (`sides`).
    phases: tuple[Literal["input", "output"], ...] | None = None
    # Phone numbers written without a +country code are read as this region's (ISO 3166).
    region: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{2}$")] | None = None
    judge: Judge | None = None

    def __post_init__(self) -> None:
        for name, pattern in self.patterns.items():
            if not _CATEGORY.fullmatch(name):
                raise ValueError(f"patterns: {name!r} is no category name: upper-case letters, "
                                 "digits and _, at most 40, as its placeholders spell it")
            try:
                if re.compile(pattern).match(""):
                    raise ValueError(f"patterns.{name}: matches the empty text")
            except re.error as exc:
                raise ValueError(f"patterns.{name}: not a regex: {exc}") from None
        if any(not word.strip() for word in self.words):
            raise ValueError("words: an empty word")
        if not (self.detect or self.patterns or self.words or self.judge):
            raise ValueError("detects nothing: give `detect`, `patterns`, `words` or `judge`")
        if self.phases is not None and not self.phases:
            raise ValueError("phases: give \"input\", \"output\" or both")
        if self.judge is not None and (self.action != "block" or "output" in self.sides):
            raise ValueError("judge: a judge blocks (`action`: \"block\") and reads requests "
                             "(`phases`: [\"input\"])")

    @property
    def sides(self) -> tuple[Literal["input", "output"], ...]:
        """The phases it screens: as given, else both (the input alone for a judge)."""
        if self.phases is not None:
            return self.phases
        return ("input",) if self.judge is not None else ("input", "output")
