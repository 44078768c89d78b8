"""Names and places found by a named-entity model (Presidio on spaCy, the `ner` extra), off
the event loop.

A model reads a 2 KB prompt in tens to hundreds of milliseconds, holding the GIL most of the
time: it runs in one worker thread of its own, never on the event loop, and only for a request
whose guardrails name `person` or `location`. The model is loaded once per process, in that
thread, when the first snapshot that asks for it is compiled (`warm`): a gateway whose policies
never ask for it imports neither Presidio nor spaCy. One request's look is bounded by the
length of its text and by a timeout; past either it is refused, since a text no model read
would go to the provider unscreened.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from gateway.core.settings.guardrails import Ner
from gateway.guardrails.detectors import Found

# The placeholder categories (`[PERSON_1]`), and what Presidio calls them.
PERSON, LOCATION = "PERSON", "LOCATION"
_PRESIDIO = {"person": PERSON, "location": LOCATION}

T = TypeVar("T")

class EntitiesUnread(Exception):
    """A request's text was not read by the model: too long, too slow, or no model."""


class Models:
    """The process's named-entity models and the one worker thread that loads and runs them
    (held by the runtime: a model takes seconds to load and outlives a reload)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._worker: ThreadPoolExecutor | None = None
        self._engines: dict[str, Future[Any]] = {}  # model -> its AnalyzerEngine

    def warm(self, model: str) -> None:
        """The model loaded in the worker thread, once per process (a snapshot compiled with a
        policy that names it calls this; the first request waits for the load, if still on)."""
        worker = self._executor()
        with self._lock:
            if model not in self._engines:
                self._engines[model] = worker.submit(_engine, model)

    def engine(self, model: str) -> Any:
        """The loaded engine of `model`; blocking: only in the worker thread."""
        return self._engines[model].result()

    async def off_loop(self, work: Callable[[], T], entities: Sequence[Entities],
                       chars: int) -> T:
        """`work`'s result, run in the worker thread once the models of `entities` are
        loaded; EntitiesUnread when the request's text (`chars` long) is over a bound, the look
        over its timeout, or a model failed to load."""
        limit = min(e.max_chars for e in entities)
        if chars > limit:
            raise EntitiesUnread(f"over the {limit} characters read for names and places")
        for model in {e.model for e in entities}:
            self.warm(model)
            try:  # the load is once per process: not counted in a request's timeout
                await asyncio.shield(asyncio.wrap_future(self._engines[model]))
            except Exception as exc:
                raise EntitiesUnread(f"not read for names and places: the model {model!r} "
                                     f"did not load ({type(exc).__name__})") from None
        timeout = min(e.timeout for e in entities)
        try:
            # A look still queued when its request gives up is dropped (its future cancelled).
            return await asyncio.wait_for(asyncio.wrap_future(self._executor().submit(work)),
                                          timeout)
        except TimeoutError:
            raise EntitiesUnread(f"not read for names and places within {timeout:g}s") from None

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llms-ner")
            return self._worker


class Entities:
    """One policy's named-entity detection: the categories it looks for, in which model, and
    the bounds of one request's look."""

    __slots__ = ("categories", "max_chars", "model", "models", "timeout")

    def __init__(self, detect: Sequence[str], ner: Ner | None, models: Models) -> None:
        ner = ner or Ner()
        self.categories = tuple(_PRESIDIO[kind] for kind in detect if kind in _PRESIDIO)
        self.model, self.timeout, self.max_chars = ner.model, ner.timeout, ner.max_chars
        self.models = models
        models.warm(self.model)

    def find(self, text: str) -> list[Found]:
        """The names and places of `text`, in order; blocking: only in the worker thread."""
        engine = self.models.engine(self.model)
        results = engine.analyze(text=text, language="en", entities=list(self.categories))
        return sorted(Found(r.start, r.end, r.entity_type) for r in results
                      if r.entity_type in self.categories and r.end > r.start)


def _engine(model: str) -> Any:
    """Presidio's analyzer on `model`, with its spaCy recognizer alone: the gateway's own
    detectors find e-mail addresses, cards and the rest, with their checks."""
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    nlp = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": model}])
    nlp.load()
    # The tagger, parser and lemmatizer feed Presidio's context words, which its spaCy
    # recognizer does not use: off, a text is read in half the time. What `ner` listens to (a
    # shared tok2vec or transformer, in models other than the small one) stays on.
    language = nlp.get_nlp("en")
    for name, pipe in language.pipeline:
        if name != "ner" and "ner" not in getattr(pipe, "listening_components", ()):
            language.disable_pipe(name)
    registry = RecognizerRegistry(supported_languages=["en"])
    registry.add_recognizer(SpacyRecognizer(supported_language="en"))
    return AnalyzerEngine(nlp_engine=nlp, registry=registry, supported_languages=["en"])
