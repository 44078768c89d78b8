"""Stories about rate limits, told to a running gateway within one minute of the wall clock.

A key's limits count in fixed minutes (`gateway.core.limits`, whose window rule is tested
on an injected clock). A gateway run the way users run it reads the wall clock, so a story told
through its socket holds only if it does not straddle the end of a minute. Rather than wait for
the next minute to begin, a story that straddled one is told again: it takes seconds, so the
second telling fits inside the minute the first spilled into. A telling must not lean on what
an earlier one counted (it starts its own gateway, or counts only what it spends itself).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
MINUTE = 60  # seconds: the limiter's window (`gateway.core.limits.WINDOW`)


def within_one_minute(story: Callable[[], T]) -> T:
    """What `story()` gave in a telling that began and ended in the same minute. A telling that
    straddled a minute's end proves nothing either way: it is discarded, a failed assertion
    with it, and the story told again."""
    for _ in range(2):
        began = _minute()
        try:
            told = story()
        except AssertionError:
            if _minute() == began:
                raise
            continue
        if _minute() == began:
            return told
    raise AssertionError("two tellings each straddled a minute's end: the story is too long")


def _minute() -> int:
    return int(time.time() // MINUTE)
