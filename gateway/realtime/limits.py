"""How many Realtime sessions are open, per key and over all keys, in this process.

A session holds a WebSocket, an upstream connection and a task for minutes: a key may open
`realtime.max_sessions_per_key` at once, and the process `realtime.max_sessions` (an open
gateway's callers, who present no key, share one count). A session over either is refused with
429 before any upstream is dialled; its place is given back once, however it ended.
"""

from __future__ import annotations

from collections import Counter

from gateway.core.errors import KeyRateLimited
from gateway.core.settings.realtime import RealtimeConfig
from providers.contract.errors import Overloaded

ANONYMOUS = "-"  # the count of callers who present no key (an open gateway)


class SessionCounts:
    """The sessions open in this process, counted per key."""

    def __init__(self) -> None:
        self.open: Counter[str] = Counter()
        self.total = 0

    def enter(self, key_id: str | None, limits: RealtimeConfig) -> str:
        """Count a session for `key_id`; refused (429, or 503 for the process) past a limit.
        Returns what `leave` takes."""
        held = key_id or ANONYMOUS
        if self.total >= limits.max_sessions:
            raise Overloaded(f"This gateway has {self.total} Realtime sessions open, its most "
                             "(realtime.max_sessions)", retry_after=5.0)
        if self.open[held] >= limits.max_sessions_per_key:
            raise KeyRateLimited(f"This key has {self.open[held]} Realtime sessions open, its "
                                 "most (realtime.max_sessions_per_key)", retry_after=5.0)
        self.open[held] += 1
        self.total += 1
        return held

    def leave(self, held: str) -> None:
        """A session counted by `enter` ended."""
        self.total -= 1
        self.open[held] -= 1
        if self.open[held] <= 0:
            del self.open[held]
