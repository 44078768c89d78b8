"""The queue in front of `server.max_concurrency`: wait for a slot instead of a 503 wall.

Batch jobs and interactive users share one gateway. Refusing every request past the cap at
once makes the interactive user lose to whichever batch job fired first; so a request that
finds every slot taken waits here, in a bounded queue (`server.max_queue`), for the next slot
freed:

- in a fair order between keys and by priority within one (`gateway.queue.fair`);
- until its deadline (`x-llms-timeout`, its key's `timeout`, at most `server.queue_timeout`):
  one whose deadline passes while it waits is a 504 `queue_timeout`;
- or not at all: a request that finds the queue full, or whose turn would come after its
  deadline (estimated from its place and the pace the queue measured, `Pace`), gets the 503
  `overloaded` at once, with a `Retry-After` from that same pace rather than a guess;
- a client that leaves while it waits leaves the queue (the caller's `DisconnectGuard` cancels
  the wait).

A request's `Ticket` is taken when it arrives (`front.Front`) and given back once, however it
ends (`leave`): a ticket that was granted a slot frees it for the next in line.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping

import msgspec

from gateway.core.errors import QueueTimeout
from gateway.core.limits import PRIORITY_BOUND, KeyLimits
from gateway.core.settings import DEFAULT_MAX_BODY_BYTES_HELD
from gateway.queue.bodies import Bodies
from gateway.queue.fair import Entry, FairOrder
from providers.contract.errors import InvalidRequest, Overloaded
from providers.contract.pace import Pace

PRIORITY_HEADER = "x-llms-priority"
TIMEOUT_HEADER = "x-llms-timeout"
ANONYMOUS = "anonymous"  # the key requests without one share (no keys configured)
_ANONYMOUS = KeyLimits(ANONYMOUS)
# Why a request left the queue without its turn: `llms_queue_dropped_total{reason}`.
FULL, DEADLINE, TIMEOUT, LEFT = "full", "deadline", "timeout", "client_left"


class Turn(msgspec.Struct, frozen=True):
    """What a request asks of the queue: whose it is, its priority, how long it may wait."""

    key: str
    priority: int = 0
    timeout: float = 60.0
    weight: int = 1


def turn_of(headers: Mapping[str, str], key: KeyLimits | None, queue_timeout: float) -> Turn:
    """The request's turn from its headers and key: `x-llms-priority` capped by the key's
    `max_priority` (its `priority` without the header), `x-llms-timeout` or the key's `timeout`,
    both at most `queue_timeout`. A value that is not a number is a 400 naming the header."""
    limits = key or _ANONYMOUS
    priority = min(limits.priority, limits.max_priority)
    if (raw := headers.get(PRIORITY_HEADER)) is not None:
        priority = min(_priority(raw), limits.max_priority)
    timeout = limits.timeout if limits.timeout is not None else queue_timeout
    if (raw := headers.get(TIMEOUT_HEADER)) is not None:
        timeout = _seconds(raw)
    return Turn(limits.key_id, priority, min(timeout, queue_timeout), limits.weight)


def _priority(raw: str) -> int:
    text = raw.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > 7 \
            or abs(value := int(text)) > PRIORITY_BOUND:
        raise InvalidRequest(f"{PRIORITY_HEADER} must be an integer between -{PRIORITY_BOUND} "
                             f"and {PRIORITY_BOUND}, got {raw[:40]!r}", param=PRIORITY_HEADER)
    return value


def _seconds(raw: str) -> float:
    try:
        value = float(raw.strip()) if len(raw) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:  # nan and inf parse: refused all the same
        raise InvalidRequest(f"{TIMEOUT_HEADER} must be a number of seconds, 0 or more, "
                             f"got {raw[:40]!r}", param=TIMEOUT_HEADER)
    return value


class Ticket:
    """One request's claim on a slot: waiting, granted, or neither (refused, left)."""

    __slots__ = ("entry", "granted", "key", "since", "started")

    def __init__(self, since: float) -> None:
        self.since = since  # when it arrived
        self.key = ANONYMOUS
        self.entry: Entry[Ticket] | None = None  # while it waits
        self.granted: asyncio.Future[None] | None = None
        self.started: float | None = None  # when it was given a slot

    @property
    def waited(self) -> float:
        """Seconds it waited for its slot (0 until it has one)."""
        return 0.0 if self.started is None else self.started - self.since


class Queue:
    """The slots under `max_concurrency` and the requests waiting for one, on an injected
    clock. `on_wait(key, seconds)`, `on_drop(key, reason)` and `on_depth(delta)` tell the
    metrics."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[str, float], None] = lambda key, seconds: None,
                 on_drop: Callable[[str, str], None] = lambda key, reason: None,
                 on_depth: Callable[[int], None] = lambda delta: None) -> None:
        self.clock = clock
        self.on_wait, self.on_drop, self.on_depth = on_wait, on_drop, on_depth
        self.max_concurrency = 10_000
        self.max_queue = 1_000
        self.pace = Pace(clock)
        self.order: FairOrder[Ticket] = FairOrder()
        self.running: set[Ticket] = set()
        self.dropped: Counter[tuple[str, str]] = Counter()  # (key, reason): how many
        self.bodies = Bodies(DEFAULT_MAX_BODY_BYTES_HELD)  # what the requests' bodies hold

    @property
    def depth(self) -> int:
        """Requests waiting now."""
        return len(self.order)

    def configure(self, max_concurrency: int, max_queue: int,
                  max_body_bytes_held: int = DEFAULT_MAX_BODY_BYTES_HELD) -> None:
        """Take a config's limits; a larger cap starts whoever it makes room for."""
        self.max_concurrency, self.max_queue = max_concurrency, max_queue
        self.bodies.budget = max_body_bytes_held
        self._hand()

    def ticket(self) -> Ticket:
        """A new request's ticket, to be given back with `leave` however it ends."""
        return Ticket(self.clock())

    def hold(self) -> Ticket:
        """A ticket holding a slot at once, past `max_concurrency` if need be: for work that
        runs already and must keep counting (a keyed flight whose client left)."""
        ticket = self.ticket()
        ticket.started = ticket.since  # it never waited: no queue-wait sample
        self.running.add(ticket)
        return ticket

    def check_room(self, turn: Turn) -> None:
        """Overloaded now if `turn` could neither start nor wait (every slot taken and the
        queue full): asked before the request's body is read, so a flood past the queue costs
        no body reads."""
        if self.order.size >= self.max_queue and len(self.running) >= self.max_concurrency:
            raise self._full(turn.key)

    def start_now(self, ticket: Ticket, turn: Turn) -> bool:
        """Give `ticket` a slot if one is free and nobody waits for it; False: `wait`."""
        ticket.key = turn.key
        if self.order.size or len(self.running) >= self.max_concurrency:
            return False
        self._start(ticket)
        return True

    async def wait(self, ticket: Ticket, turn: Turn) -> None:
        """Return once `ticket` holds a slot. Overloaded at once when the queue is full or the
        turn would come after `turn.timeout`; QueueTimeout when that passes while waiting."""
        if self.start_now(ticket, turn):
            return
        if len(self.order) >= self.max_queue:
            raise self._full(turn.key)
        expected = self.expected_wait(self.order.place(turn.key, turn.priority))
        if expected > turn.timeout:
            raise self._refused(turn.key, DEADLINE, expected,
                                f"The gateway is at its concurrency limit; this request's turn "
                                f"is expected in {expected:.1f}s, after its {turn.timeout:g}s "
                                f"deadline")
        ticket.granted = asyncio.get_running_loop().create_future()
        ticket.entry = self.order.push(ticket, turn.key, turn.priority, turn.weight)
        self.on_depth(1)
        try:
            async with asyncio.timeout(turn.timeout):
                await asyncio.shield(ticket.granted)
        except TimeoutError:
            if ticket.started is not None:
                return  # granted in the same instant its deadline passed: it made it
            self._drop(ticket, TIMEOUT)
            raise QueueTimeout(f"The request waited {turn.timeout:g}s in the gateway's queue "
                               "without its turn coming (x-llms-timeout)") from None
        except BaseException:  # the client left (cancelled by its guard)
            if ticket.started is None:
                self._drop(ticket, LEFT)
            raise

    def leave(self, ticket: Ticket) -> None:
        """`ticket`'s request is done, or abandoned: its slot goes to the next in line, or it
        leaves the line. Safe to call once per ticket whatever happened to it."""
        self._unqueue(ticket)
        if ticket not in self.running:
            return
        waiting = self.order.size > 0
        saturated = waiting or len(self.running) >= self.max_concurrency
        self.running.discard(ticket)
        assert ticket.started is not None
        self.pace.released(self.clock() - ticket.started, saturated)
        if waiting:  # else nobody to hand its slot to
            self._hand()

    def expected_wait(self, ahead: int) -> float:
        """Seconds until a request with `ahead` before it gets a slot, at the measured pace."""
        oldest = 0.0
        if not self.pace.measured and self.running:  # only then is the oldest's age used
            now = self.clock()
            oldest = max(now - (t.started or now) for t in self.running)
        return self.pace.expected_wait(ahead, self.max_concurrency, oldest)

    def retry_after(self) -> float:
        """When a request refused now should come back: once the queue has moved past it."""
        return self.expected_wait(len(self.order))

    def view(self) -> dict[str, object]:
        """What the status page shows: slots, depth per key, drops per reason."""
        reasons: Counter[str] = Counter()
        for (_, reason), count in self.dropped.items():
            reasons[reason] += count
        return {"running": len(self.running), "max_concurrency": self.max_concurrency,
                "depth": len(self.order), "max_queue": self.max_queue,
                "waiting": self.order.depths(), "dropped": dict(reasons),
                "pace_s": self.pace.gap, "body_bytes_held": self.bodies.held,
                "max_body_bytes_held": self.bodies.budget}

    def _start(self, ticket: Ticket) -> None:
        ticket.started = self.clock()
        self.running.add(ticket)
        self.on_wait(ticket.key, ticket.started - ticket.since)

    def _hand(self) -> None:
        """Start whoever waits, in the fair order, while slots are free."""
        while len(self.running) < self.max_concurrency and (entry := self.order.pop()):
            ticket = entry.item
            ticket.entry = None
            self.on_depth(-1)
            self._start(ticket)
            if ticket.granted is not None and not ticket.granted.done():
                ticket.granted.set_result(None)

    def _unqueue(self, ticket: Ticket) -> None:
        if ticket.entry is not None and self.order.remove(ticket.entry):
            self.on_depth(-1)
        ticket.entry = None

    def _drop(self, ticket: Ticket, reason: str) -> None:
        self._unqueue(ticket)
        self.dropped[(ticket.key, reason)] += 1
        self.on_drop(ticket.key, reason)

    def _full(self, key: str) -> Overloaded:
        return self._refused(key, FULL, self.expected_wait(len(self.order)),
                             f"The gateway is at its concurrency limit and its queue is full "
                             f"({self.max_queue} waiting)")

    def _refused(self, key: str, reason: str, wait: float, message: str) -> Overloaded:
        self.dropped[(key, reason)] += 1
        self.on_drop(key, reason)
        return Overloaded(f"{message}; retry in {max(1, math.ceil(wait))}s", retry_after=wait)
