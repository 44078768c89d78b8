"""How fast a line of waiting requests moves, measured rather than guessed.

Both lines that make requests wait share it: the gateway's queue in front of
`server.max_concurrency` and a worker pool's line in front of its workers. A request refused
because a line is full, or because its turn would come after its deadline, is told when to come
back from what `Pace` measured: how fast held requests have been leaving, not a constant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

SMOOTHING = 0.3  # the weight of the newest measurement in each moving average


def _averaged(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass(slots=True)
class Pace:
    """How fast one line's held requests leave, as measured on an injected clock.

    The best measure is the interval between two releases while every slot was taken: the
    line's real pace. Before the line has been saturated, Little's law gives the pace from how
    long each request held its slot; before anything finished, the oldest held request's age
    is a lower bound of that.
    """

    clock: Callable[[], float] = time.monotonic
    gap: float | None = None  # seconds between releases while saturated, averaged
    hold: float | None = None  # seconds a request held its slot, averaged
    _last_busy_release: float | None = None

    def released(self, held_for: float, saturated: bool) -> None:
        """A request left its slot after `held_for` seconds; `saturated`: every slot was taken
        (or requests were waiting) when it did."""
        now = self.clock()
        self.hold = _averaged(self.hold, held_for)
        if saturated and self._last_busy_release is not None:
            self.gap = _averaged(self.gap, now - self._last_busy_release)
        self._last_busy_release = now if saturated else None

    @property
    def measured(self) -> bool:
        """Whether anything has left yet (else the oldest held request's age is the guess)."""
        return self.gap is not None or self.hold is not None

    def expected_wait(self, ahead: int, slots: int, oldest_held: float) -> float:
        """Seconds until a request with `ahead` requests before it in line gets a slot, with
        `slots` slots serving the line and the oldest held request `oldest_held` seconds in."""
        pace = self.gap
        if pace is None:
            hold = self.hold if self.hold is not None else oldest_held
            pace = hold / max(1, slots)
        return (ahead + 1) * pace
