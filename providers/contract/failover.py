"""The one failover loop: try candidates in turn until one answers.

Used by the router over providers (`gateway.routing.router`) and by a worker pool over its workers
(`providers.kinds.pool.provider`): what a candidate is, and what trying it means, are theirs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from providers.contract.errors import ProviderError

C = TypeVar("C")
T = TypeVar("T")


class NoneAnswered(Exception):
    """Every candidate failed, or there was none; `last` is the last failure, if any."""

    def __init__(self, last: ProviderError | None) -> None:
        super().__init__(str(last) if last else "no candidate")
        self.last = last


async def first_answer(pick: Callable[[], C | None], attempt: Callable[[C], Awaitable[T]]) -> T:
    """`attempt` each candidate `pick` gives, in turn, until one answers; a `ProviderError`
    moves on, any other error ends the loop. NoneAnswered when `pick` runs out."""
    last: ProviderError | None = None
    while (candidate := pick()) is not None:
        try:
            return await attempt(candidate)
        except ProviderError as exc:
            last = exc
    raise NoneAnswered(last)
