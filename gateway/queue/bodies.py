"""The bytes of request bodies this process holds, bounded (`server.max_body_bytes_held`).

Each request's body is bounded by `server.max_body_bytes`, and the requests by the slots and the
queue; but a thousand queued requests of 20 MiB each are 20 GB. So the bodies held at once (read
or being read, by requests queued or in flight) have one budget per process: a request that
would go past it is refused with 503 `overloaded` and a `Retry-After` before the rest of its body
is read, and what a request held is given back once, when it ends, however it ends (answered,
failed, its client gone, its stream cut).

A declared `Content-Length` is taken whole before the first byte is read; a chunked body is
taken chunk by chunk as it arrives (`Holding.take`, the meter the edge's body read calls).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from providers.contract.errors import Overloaded


class Bodies:
    """The budget of body bytes one process holds, and what is held now."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0


class Holding:
    """What one request's body holds of the budget: empty until its body is read, taken as it
    is read, given back once; `retry_after` says when a request refused for want of room should
    come back."""

    __slots__ = ("_retry_after", "bodies", "held")

    def __init__(self, bodies: Bodies, retry_after: Callable[[], float]) -> None:
        self.bodies = bodies
        self._retry_after = retry_after
        self.held = 0

    def take(self, size: int) -> None:
        """`size` more bytes of this body are about to be read; Overloaded (nothing taken)
        when they do not fit in what the other bodies the process holds leave."""
        bodies = self.bodies
        # A body alone in the process is never refused (`max_body_bytes` bounds it): a budget
        # below one body must not refuse it for ever.
        if bodies.held + size > bodies.budget and bodies.held > self.held:
            wait = max(1.0, self._retry_after())
            raise Overloaded(
                f"The gateway holds {bodies.held} bytes of request bodies and may hold "
                f"{bodies.budget} (server.max_body_bytes_held); this one does not fit now: "
                f"retry in {math.ceil(wait)}s", retry_after=wait)
        bodies.held += size
        self.held += size

    def release(self) -> None:
        """The request is over: its bytes go back to the budget (once)."""
        self.bodies.held -= self.held
        self.held = 0
