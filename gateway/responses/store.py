"""Recent responses, so a follow-up turn can say `previous_response_id` (bounded, in memory)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_CAPACITY = 10_000


class ResponseStore:
    """The conversation up to and including each stored response, as chat messages."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._turns: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._turns[response_id] = messages
        self._turns.move_to_end(response_id)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        return self._turns.get(response_id)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._turns
