"""Waiting for something to happen, never for a guessed time.

An effect a test cannot be told of (a log line written after the answer, a sync through Redis,
a worker up, a request reaching a fake) is asked for by name with a deadline: `wait_until`
polls until it holds and fails naming what never came. A time rule (a rate-limit window, a
breaker's open period) is tested on an injected clock instead (`clock=` in gateway/), not slept
through.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T | None], within: float = 10.0, every: float = 0.05,
               what: str | None = None) -> T:
    """`condition()`'s first truthy value, asked every `every` seconds; an AssertionError
    naming `what` (else the condition's own source) once `within` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {within}s: {what or _described(condition)}")
        time.sleep(every)


def _described(condition: Callable[[], object]) -> str:
    """A lambda's source line, else the function's name."""
    if getattr(condition, "__name__", "") == "<lambda>":
        try:
            return inspect.getsource(condition).strip()
        except (OSError, TypeError):
            pass
    return str(getattr(condition, "__qualname__", condition))
