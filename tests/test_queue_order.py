"""The queue's rules, without sockets: who starts next (fair between keys, by priority within
one), when a request is refused at once or times out, what a client that leaves costs, and how
the request's headers become its turn. Time is an injected clock; asyncio runs the waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gateway.core.errors import QueueTimeout
from gateway.core.limits import KeyLimits
from gateway.queue.fair import FairOrder
from gateway.queue.queueing import Queue, Ticket, Turn, turn_of
from providers.contract.errors import InvalidRequest, Overloaded


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drained(order: FairOrder[str]) -> list[str]:
    started = []
    while (entry := order.pop()) is not None:
        started.append(entry.item)
    return started


# --- the order -----------------------------------------------------------------------------

def test_one_keys_burst_waits_behind_itself_not_in_front_of_another_key() -> None:
    order: FairOrder[str] = FairOrder()
    for n in range(5):
        order.push(f"batch-{n}", "batch")
    order.push("chat-0", "chat")
    order.push("chat-1", "chat")

    assert drained(order) == ["batch-0", "chat-0", "batch-1", "chat-1", "batch-2", "batch-3",
                              "batch-4"]


def test_within_a_key_the_highest_priority_starts_first_then_the_first_come() -> None:
    order: FairOrder[str] = FairOrder()
    for name, priority in [("low", 1), ("high", 5), ("mid", 3), ("high-later", 5)]:
        order.push(name, "key", priority)

    assert drained(order) == ["high", "high-later", "mid", "low"]


def test_a_high_priority_orders_its_own_key_only_never_jumps_another() -> None:
    order: FairOrder[str] = FairOrder()
    order.push("other-0", "other")
    order.push("other-1", "other")
    order.push("urgent-0", "urgent", priority=100)
    order.push("urgent-1", "urgent", priority=100)

    assert drained(order) == ["other-0", "urgent-0", "other-1", "urgent-1"]


def test_a_keys_weight_is_how_many_it_starts_per_turn() -> None:
    order: FairOrder[str] = FairOrder()
    for n in range(4):
        order.push(f"a{n}", "a", weight=2)
    for n in range(3):
        order.push(f"b{n}", "b")

    assert drained(order) == ["a0", "a1", "b0", "a2", "a3", "b1", "b2"]


def test_a_removed_request_leaves_its_place_and_an_emptied_key_its_turn() -> None:
    order: FairOrder[str] = FairOrder()
    gone = order.push("a0", "a")
    order.push("b0", "b")
    order.push("b1", "b")
    order.push("c0", "c")

    assert order.remove(gone) and not order.remove(gone)
    assert len(order) == 3 and order.depths() == {"b": 2, "c": 1}
    assert drained(order) == ["b0", "c0", "b1"]


@pytest.mark.parametrize(("key", "priority", "place"), [
    # Starting order a0 b0 c0 a1 b1 a2 b2 [new]: 7; the estimate counts a turn more at most.
    pytest.param("a", 0, 3 + 4 + 1, id="behind its own three, and four turns of the others"),
    pytest.param("a", 9, 1 + 2 + 1, id="ahead of its own lower ones"),
    pytest.param("new", 0, 1 + 1 + 1, id="a new key: one turn of each key"),
])
def test_the_place_a_new_request_would_take(key: str, priority: int, place: int) -> None:
    order: FairOrder[str] = FairOrder()
    for n, p in enumerate([9, 0, 0]):
        order.push(f"a{n}", "a", p)
    for n in range(5):
        order.push(f"b{n}", "b")
    order.push("c0", "c")

    assert order.place(key, priority) == place


# --- the queue -----------------------------------------------------------------------------

def run(story: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(story())


async def settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def full_queue(clock: Clock, slots: int = 1, max_queue: int = 10) -> tuple[Queue, list[Ticket]]:
    """A queue with every slot taken."""
    queue = Queue(clock)
    queue.configure(slots, max_queue)
    running = [queue.ticket() for _ in range(slots)]
    for ticket in running:
        assert queue.start_now(ticket, Turn("holder"))
    return queue, running


def test_a_freed_slot_goes_to_the_next_in_the_fair_order() -> None:
    async def story() -> None:
        clock = Clock()
        queue, (holder,) = full_queue(clock)
        started: list[str] = []

        async def request(name: str, key: str) -> None:
            ticket = queue.ticket()
            await queue.wait(ticket, Turn(key, timeout=60))
            started.append(name)

        tasks = [asyncio.create_task(request(n, k)) for n, k in
                 [("b0", "batch"), ("b1", "batch"), ("b2", "batch"), ("c0", "chat")]]
        await settled()
        assert queue.depth == 4 and started == []
        queue.leave(holder)
        await settled()
        assert started == ["b0"]  # one slot: one started
        for _ in range(3):
            queue.leave(next(t for t in queue.running))
            await settled()
        await asyncio.gather(*tasks)
        assert started == ["b0", "c0", "b1", "b2"]

    run(story)


def test_a_full_queue_refuses_at_once_with_when_to_come_back_from_the_measured_pace() -> None:
    async def story() -> None:
        clock = Clock()
        queue, _ = full_queue(clock, slots=2, max_queue=1)
        queue.pace.gap = 3.0  # the queue has measured one slot freed every 3 s
        waiting = asyncio.create_task(queue.wait(queue.ticket(), Turn("a", timeout=60)))
        await settled()

        with pytest.raises(Overloaded) as refused:
            await queue.wait(queue.ticket(), Turn("b", timeout=60))

        assert refused.value.retry_after == pytest.approx(6.0)  # one ahead, then its own turn
        assert refused.value.headers() == {"Retry-After": "6"}
        with pytest.raises(Overloaded):  # and before reading its body
            queue.check_room(Turn("b"))
        assert queue.dropped == {("b", "full"): 2}
        waiting.cancel()

    run(story)


def test_a_turn_expected_after_the_deadline_is_refused_at_once_not_after_waiting() -> None:
    async def story() -> None:
        clock = Clock()
        queue, _ = full_queue(clock)
        queue.pace.gap = 2.0
        ahead = [asyncio.create_task(queue.wait(queue.ticket(), Turn("a", timeout=60)))
                 for _ in range(3)]
        await settled()

        with pytest.raises(Overloaded) as refused:  # 4th in line, 2 s each: 8 s > 5 s
            await queue.wait(queue.ticket(), Turn("a", timeout=5))

        assert refused.value.retry_after == pytest.approx(8.0)
        assert queue.dropped == {("a", "deadline"): 1} and queue.depth == 3
        # Another key's request is 2nd in the fair order: 4 s, within its 5 s.
        other = asyncio.create_task(queue.wait(queue.ticket(), Turn("b", timeout=5)))
        await settled()
        assert queue.depth == 4
        for task in [*ahead, other]:
            task.cancel()

    run(story)


def test_a_deadline_passing_in_the_queue_is_a_queue_timeout_and_frees_its_place() -> None:
    async def story() -> None:
        clock = Clock()
        queue, _ = full_queue(clock)

        with pytest.raises(QueueTimeout) as timed_out:  # nothing frees a slot
            await queue.wait(queue.ticket(), Turn("a", timeout=0.01))

        assert timed_out.value.status == 504 and timed_out.value.code == "queue_timeout"
        assert queue.depth == 0 and queue.dropped == {("a", "timeout"): 1}

    run(story)


def test_a_client_that_leaves_leaves_the_queue_and_the_next_one_gets_the_slot() -> None:
    async def story() -> None:
        clock = Clock()
        queue, (holder,) = full_queue(clock)
        leaving, staying = queue.ticket(), queue.ticket()
        gone = asyncio.create_task(queue.wait(leaving, Turn("a", timeout=60)))
        kept = asyncio.create_task(queue.wait(staying, Turn("a", timeout=60)))
        await settled()

        gone.cancel()
        await settled()
        queue.leave(leaving)  # what the front does however a request ends: harmless here
        queue.leave(holder)
        await kept

        assert queue.running == {staying} and queue.depth == 0
        assert queue.dropped == {("a", "client_left"): 1}

    run(story)


def test_the_pace_is_measured_from_slots_freed_while_saturated() -> None:
    async def story() -> None:
        clock = Clock()
        queue, (holder,) = full_queue(clock)
        tickets = [queue.ticket() for _ in range(3)]
        tasks = [asyncio.create_task(queue.wait(t, Turn("a", timeout=60))) for t in tickets]
        await settled()
        for ticket in [holder, *tickets]:
            clock.now += 2.0
            queue.leave(ticket)
            await settled()
        await asyncio.gather(*tasks)

        assert queue.pace.gap == pytest.approx(2.0)
        assert queue.expected_wait(4) == pytest.approx(10.0)

    run(story)


def test_a_larger_cap_on_reload_starts_whoever_it_makes_room_for() -> None:
    async def story() -> None:
        clock = Clock()
        queue, _ = full_queue(clock)
        tasks = [asyncio.create_task(queue.wait(queue.ticket(), Turn("a", timeout=60)))
                 for _ in range(2)]
        await settled()

        queue.configure(3, 10)
        await asyncio.gather(*tasks)

        assert len(queue.running) == 3 and queue.depth == 0

    run(story)


# --- the request's turn --------------------------------------------------------------------

BATCH = KeyLimits("batch", priority=0, max_priority=2, timeout=30.0, weight=1)


@pytest.mark.parametrize(("headers", "key", "turn"), [
    pytest.param({}, None, Turn("anonymous", 0, 60.0), id="anonymous: defaults"),
    pytest.param({}, BATCH, Turn("batch", 0, 30.0), id="the key's defaults"),
    pytest.param({"x-llms-priority": "1"}, BATCH, Turn("batch", 1, 30.0), id="asked"),
    pytest.param({"x-llms-priority": "50"}, BATCH, Turn("batch", 2, 30.0),
                 id="capped by max_priority"),
    pytest.param({"x-llms-priority": "-5"}, None, Turn("anonymous", -5, 60.0),
                 id="lower is always allowed"),
    pytest.param({"x-llms-timeout": "2.5"}, BATCH, Turn("batch", 0, 2.5), id="a deadline"),
    pytest.param({"x-llms-timeout": "0"}, BATCH, Turn("batch", 0, 0.0), id="no wait at all"),
    pytest.param({"x-llms-timeout": "900"}, BATCH, Turn("batch", 0, 60.0),
                 id="capped by the server's"),
])
def test_the_turn_a_request_asks_for(headers: dict[str, str], key: KeyLimits | None,
                                     turn: Turn) -> None:
    assert turn_of(headers, key, 60.0) == turn


@pytest.mark.parametrize(("header", "value"), [
    ("x-llms-priority", "high"), ("x-llms-priority", "1.5"), ("x-llms-priority", ""),
    ("x-llms-priority", "99999999999"), ("x-llms-priority", "\u0661"),
    ("x-llms-timeout", "soon"), ("x-llms-timeout", "-1"), ("x-llms-timeout", "nan"),
    ("x-llms-timeout", "inf"), ("x-llms-timeout", "1" * 40),
])
def test_a_bad_header_is_a_400_naming_it(header: str, value: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        turn_of({header: value}, BATCH, 60.0)

    assert refused.value.param == header and refused.value.status == 400
