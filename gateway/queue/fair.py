"""The order a queue's waiting requests start in: fair between keys, by priority within one.

Pure: no clock, no asyncio. `gateway.queue.queueing` puts each waiting request here and asks
for the next when a slot frees.

- **Between keys: weighted round robin** (deficit round robin with a cost of one per request).
  Each key with requests waiting has its own sub-queue; the keys take turns, a key starting up to
  its `weight` requests per turn. A key that sends two hundred requests at once gets its turns
  like a key that sends two: its burst waits behind itself, never in front of the others.
  Anonymous requests (no keys configured) are one key.
- **Within a key: the highest priority first**, the first come among equals. A key orders its
  own requests (`x-llms-priority`, capped by its `max_priority`); it cannot jump other keys with
  them, so a high priority is no way around fairness.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    """One waiting request: what it is, whose, and its place within its key."""

    item: T
    key: str
    priority: int
    seq: int  # arrival order, breaking ties between equal priorities

    def rank(self) -> tuple[int, int]:
        """Sorts first within its key: the highest priority, then the first come."""
        return -self.priority, self.seq


class FairOrder(Generic[T]):
    """Waiting requests in the order they will start: `push`, `pop`, `remove`, `place`."""

    def __init__(self) -> None:
        self._keys: dict[str, list[Entry[T]]] = {}  # each key's entries, sorted by `rank`
        self._weights: dict[str, int] = {}
        self._turns: deque[str] = deque()  # keys with entries, the current turn first
        self._started = 0  # requests the current turn's key has started in this turn
        self._seq = 0
        # How many wait: what `len` says, read by the queue for every request without a call.
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def depth(self, key: str) -> int:
        """How many of `key`'s requests wait."""
        return len(self._keys.get(key, ()))

    def depths(self) -> dict[str, int]:
        """How many wait, per key that has any."""
        return {key: len(entries) for key, entries in self._keys.items()}

    def push(self, item: T, key: str, priority: int = 0, weight: int = 1) -> Entry[T]:
        """Put `item` in `key`'s sub-queue; a key new to the queue takes its turn last."""
        self._seq += 1
        entry = Entry(item, key, priority, self._seq)
        entries = self._keys.get(key)
        if entries is None:
            entries = self._keys[key] = []
            self._turns.append(key)
        self._weights[key] = max(1, weight)
        insort(entries, entry, key=Entry.rank)
        self.size += 1
        return entry

    def pop(self) -> Entry[T] | None:
        """The next request to start, or None when none waits."""
        if not self._turns:
            return None
        key = self._turns[0]
        entries = self._keys[key]
        entry = entries.pop(0)
        self.size -= 1
        self._started += 1
        if not entries:
            self._drop_key(key)
        elif self._started >= self._weights[key]:
            self._turns.rotate(-1)  # its turn is used up: the next key's
            self._started = 0
        return entry

    def remove(self, entry: Entry[T]) -> bool:
        """Take `entry` out (its deadline passed, its client left); False if it is not here."""
        entries = self._keys.get(entry.key)
        if entries is None or entry not in entries:
            return False
        entries.remove(entry)
        self.size -= 1
        if not entries:
            self._drop_key(entry.key)
        return True

    def place(self, key: str, priority: int = 0) -> int:
        """How many waiting requests would start before a new one of `key` at `priority`.

        An estimate a deadline is judged by: within its key, those of a priority at least as
        high; between keys, what every other key starts in the turns its key takes to reach
        it (a turn more at most, never fewer)."""
        own = sum(1 for e in self._keys.get(key, ()) if e.priority >= priority)
        turns = math.ceil((own + 1) / self._weights.get(key, 1))
        others = sum(min(len(entries), turns * self._weights[other])
                     for other, entries in self._keys.items() if other != key)
        return own + others

    def _drop_key(self, key: str) -> None:
        if self._turns and self._turns[0] == key:
            self._started = 0  # the next key's turn starts fresh
        self._turns.remove(key)
        del self._keys[key]
        del self._weights[key]
