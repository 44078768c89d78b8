"""A request below the edge, and the stages it passes: framework-free.

The edge (`gateway.edge.front`) reads the HTTP request and hands the pipeline a `Call`: its
endpoint, headers, a way to read its body, its record, and how the client's leaving is noticed
(`watching`). Nothing below the edge sees ASGI, so a batch line, an MCP call or a Realtime
session runs the same stages with nothing faked.

A *stage* is one callable `(call, following) -> awaitable delivery`: it may answer itself,
refuse with a `GatewayError`, or call `following` (the rest of the stack) and adapt what comes
back. One that only checks the call before passing it on can be a plain function returning
`following(call)` itself: it keeps no frame of its own while the rest of the call runs.
The stages of an endpoint are composed once per config snapshot (`gateway.pipeline.stack`),
only those something in force can use; the innermost call is the relay (route, deliver).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from gateway.core.delivery import Streamed, Whole
from gateway.core.limits import KeyLimits
from gateway.core.record import Record
from gateway.core.settings import Route
from providers.contract.provider import Outgoing, Provider


class ClientDisconnected(Exception):
    """The client went away before the gateway could answer."""


class Identity(Protocol):
    """Who a call runs as: a configured key or a virtual one (`gateway.accounts`)."""

    @property
    def limits(self) -> KeyLimits: ...


Delivery = Whole | Streamed | None  # None: the client left, nothing to send
Watching = Callable[[], AbstractAsyncContextManager[Any]]
# Told that `size` more bytes of the body are about to be read (a declared length before the
# first, else each chunk): a stage bounding what bodies hold refuses them there by raising.
Meter = Callable[[int], None]
# The whole body, read with a meter; a `GatewayError` past its bound.
Reader = Callable[[Meter], Awaitable[bytes]]
Next = Callable[["Call"], Awaitable[Delivery]]


class Stage(Protocol):
    """One capability around the rest of the request side (`compose` binds `following`)."""

    def __call__(self, call: Call, following: Next) -> Awaitable[Delivery]: ...



def unmetered(size: int) -> None:
    """The meter of a call whose body nothing bounds beyond its own limit."""


def staying() -> AbstractAsyncContextManager[None]:
    """The watch of a call no client can leave (a batch's line, a flight run for its key)."""
    return contextlib.nullcontext()


class Call:
    """One request as every stage reads it; admission fills in what it parsed."""

    __slots__ = (
        "_closers",
        "_reader",
        "alias",
        "asked",
        "caller",
        "endpoint",
        "head",
        "headers",
        "key",
        "may_reach",
        "meter",
        "outgoing",
        "priority",
        "providers",
        "raw",
        "record",
        "routes",
        "state",
        "wants_usage",
        "watching",
    )

    def __init__(self, endpoint: str, headers: Mapping[str, str], record: Record,
                 reader: Reader, watching: Watching = staying,
                 key: Identity | None = None, caller: bool = False) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.record = record
        self._reader = reader
        self.meter: Meter = unmetered  # what reading the body tells (`read`)
        # `async with call.watching():` ends what runs inside with `ClientDisconnected` when
        # the client leaves (the edge's watch of its connection).
        self.watching = watching
        self.key = key
        self.caller = caller  # the key was given by whoever runs the call, not presented
        # What admission parsed (`gateway.pipeline.admission`).
        self.head: Any = None
        self.raw = b""
        self.alias = ""
        # The request's own sort and price bound (`gateway.pipeline.preferences.Asked`), or
        # None when it asks none and no alias prices its candidates.
        self.asked: Any = None
        self.routes: tuple[Route, ...] = ()
        self.providers: Mapping[str, Provider] = {}
        self.priority = 0
        self.outgoing: Outgoing | None = None
        self.wants_usage = False
        # The aliases of its fallback chains it may be served by (None: all): a key's
        # allow-list and budget apply to a fallback as to the alias asked (`accounts.stage`).
        self.may_reach: frozenset[str] | None = None
        # What one stage hands a later one of its own (the queue's ticket, say), by stage.
        self.state: dict[str, Any] = {}
        self._closers: list[Callable[[], None]] | None = None

    def read(self) -> Awaitable[bytes]:
        """The whole body (read once, by admission), told to `meter` as it is read; a
        `GatewayError` past its bound. The reader's own awaitable: no frame of its own."""
        return self._reader(self.meter)

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run `closer` once the call is over: its answer sent, or abandoned."""
        if self._closers is None:
            self._closers = [closer]
        else:
            self._closers.append(closer)

    def close(self) -> None:
        """The call is over (the edge, or whoever ran it, says so once): give back what its
        stages held, the last taken first."""
        closers, self._closers = self._closers, None
        for closer in reversed(closers or ()):
            closer()


def compose(stages: Sequence[Stage], inner: Next) -> Next:
    """The stages as one callable, the first outermost, `inner` at the bottom. Each stage is
    bound to the one after it (`_bound`): calling the stack runs no coroutine of its own
    between two stages."""
    composed = inner
    for stage in reversed(stages):
        composed = _bound(stage, composed)
    return composed


def _bound(stage: Stage, following: Next) -> Next:
    """`stage` with `following` given: a plain call handing back the stage's coroutine. Not
    `functools.partial(stage, following=...)`: a partial with a keyword builds a dict on
    every call."""

    def bound(call: Call) -> Awaitable[Delivery]:
        return stage(call, following)

    return bound
