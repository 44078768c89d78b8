"""The pool's line: a request that finds every worker busy waits its turn instead of failing,
and a full line says when to come back from what it measured, not a constant guess.

No processes here: a `Pool` whose workers are marked ready, on an injected clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.core.errors import AllProvidersFailed, Attempt
from providers.contract.errors import PoolFull, PoolNotReady
from providers.contract.pace import Pace
from providers.contract.transport import Link
from providers.kinds.pool.engines import LLAMACPP, VLLM, WorkerPlan
from providers.kinds.pool.pool import Pool, Slot
from providers.kinds.pool.queue import Line
from providers.kinds.pool.settings import read_settings
from providers.kinds.pool.worker import WorkerState

MODEL = "gemma-3-270m"


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ready_pool(clock: Clock, engine: str = LLAMACPP, workers: int = 1, **fields: Any) -> Pool:
    """A pool of `workers` ready workers serving MODEL, never started (no processes)."""
    settings = read_settings({"type": "pool", "models": {MODEL: {"source": "/m.gguf"}},
                              **fields})
    plans = [WorkerPlan(f"local-{n}", MODEL, MODEL, engine, (), 9000 + n) for n in range(workers)]
    pool = Pool("local", settings, transport=None, link=Link(), plans=plans,  # type: ignore[arg-type]
                engine=engine, clock=clock)
    for worker in pool.workers.values():
        worker.move(WorkerState.STARTING)
        worker.move(WorkerState.READY)
    return pool


def run(story: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(story())


async def settled() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(5):
        await asyncio.sleep(0)


async def take_now(pool: Pool) -> Slot:
    slot = await pool.acquire(MODEL, (), within=60)
    assert slot is not None
    return slot


def test_the_embedded_default_lets_a_handful_wait_rather_than_refuse_the_third() -> None:
    async def story() -> None:
        pool = ready_pool(Clock())
        running = [await take_now(pool) for _ in range(2)]  # one runs, one is next: sent
        waiting = [asyncio.create_task(pool.acquire(MODEL, (), within=60)) for _ in range(8)]
        await settled()

        assert pool.max_queue == 16 and pool.max_sent == 2
        assert not any(task.done() for task in waiting), "the third and later wait, unrefused"
        assert pool.line.waiting(MODEL) == 8 and pool.view()["waiting"] == 8, "shown on /ready"
        for slot in running:
            pool.release(slot)
        await settled()
        assert [task.done() for task in waiting] == [True, True] + [False] * 6, "in order"
        assert all(t.result() is not None for t in waiting[:2])
        for task in waiting:
            task.cancel()
        await settled()
        assert pool.line.waiting(MODEL) == 0

    run(story)


def test_a_slot_freed_while_others_wait_goes_to_the_first_in_line_not_a_newcomer() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), max_queue=4)
        first, second = await take_now(pool), await take_now(pool)
        waiter = asyncio.create_task(pool.acquire(MODEL, (), within=60))
        await settled()

        pool.release(first)
        newcomer = asyncio.create_task(pool.acquire(MODEL, (), within=60))
        await settled()

        assert waiter.done() and not newcomer.done(), "the newcomer queues behind"
        assert pool.workers["local-0"].load.inflight == 2
        pool.release(second)
        await settled()
        assert newcomer.done()

    run(story)


def test_a_freed_slot_goes_to_the_highest_priority_waiting_then_the_first_come() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), max_queue=8)
        held = [await take_now(pool), await take_now(pool)]
        served: list[str] = []

        async def wait(name: str, priority: int) -> None:
            slot = await pool.acquire(MODEL, (), within=60, priority=priority)
            assert slot is not None
            served.append(name)
            held.append(slot)

        waiting = [asyncio.create_task(wait(name, priority)) for name, priority in
                   [("low", 0), ("high", 9), ("mid", 5), ("high-later", 9)]]
        await settled()
        for _ in range(4):  # one slot freed at a time
            pool.release(held.pop(0))
            await settled()
        await asyncio.gather(*waiting)

        assert served == ["high", "high-later", "mid", "low"]

    run(story)


def test_a_client_that_leaves_the_line_takes_no_slot_with_it() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), max_queue=4)
        slots = [await take_now(pool), await take_now(pool)]
        gone = asyncio.create_task(pool.acquire(MODEL, (), within=60))
        await settled()
        gone.cancel()
        await settled()

        assert pool.line.waiting(MODEL) == 0
        pool.release(slots[0])
        assert pool.workers["local-0"].load.inflight == 1, "the freed slot stays free"

    run(story)


def test_a_wait_past_queue_timeout_is_a_503_with_a_retry_after() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), max_queue=4)
        await take_now(pool)
        await take_now(pool)

        with pytest.raises(PoolFull, match="queue_timeout") as refused:
            await pool.acquire(MODEL, (), within=0.001)

        assert refused.value.retry_after is not None and refused.value.retry_after >= 0
        assert pool.line.waiting(MODEL) == 0

    run(story)


def test_a_full_line_is_a_503_whose_retry_after_is_the_pace_the_line_measured() -> None:
    async def story() -> None:
        clock = Clock()
        pool = ready_pool(clock, max_queue=4)  # one worker: 2 sent, 2 waiting
        held = [await take_now(pool), await take_now(pool)]
        line = [asyncio.create_task(pool.acquire(MODEL, (), within=60)) for _ in range(2)]
        await settled()
        # Saturated, the line drains one request every 3 seconds, as measured.
        for _ in range(4):
            clock.advance(3.0)
            pool.release(held.pop(0))
            await settled()
            done = [t for t in line if t.done()]
            for task in done:
                line.remove(task)
                held.append(task.result())
                line.append(asyncio.create_task(pool.acquire(MODEL, (), within=60)))
            await settled()

        assert pool.full(MODEL) and pool.line.waiting(MODEL) == 2
        with pytest.raises(PoolFull, match="max_queue") as refused:
            await pool.acquire(MODEL, (), within=60)

        # Two wait ahead of it; one leaves every 3 seconds: a slot in about 9 seconds.
        assert refused.value.retry_after == pytest.approx(9.0)
        everyone = AllProvidersFailed(MODEL, [Attempt("local", None, "pool_full",
                                                      refused.value.message,
                                                      refused.value.retry_after)])
        assert everyone.status == 503 and everyone.body()["code"] == "overloaded"
        assert everyone.headers() == {"Retry-After": "9"}
        for task in line:
            task.cancel()
        await settled()

    run(story)


def test_a_slower_line_says_come_back_later() -> None:
    async def story() -> None:
        waits = []
        for pace in (2.0, 7.5):
            clock = Clock()
            pool = ready_pool(clock, max_queue=2)  # nothing waits: refused once 2 are sent
            held = [await take_now(pool), await take_now(pool)]
            for _ in range(3):
                clock.advance(pace)
                pool.release(held.pop(0))
                held.append(await take_now(pool))
            with pytest.raises(PoolFull) as refused:
                await pool.acquire(MODEL, (), within=60)
            waits.append(refused.value.retry_after)

        assert waits == [pytest.approx(2.0), pytest.approx(7.5)]

    run(story)


def test_a_full_pool_that_never_finished_a_request_bases_retry_after_on_its_oldest() -> None:
    async def story() -> None:
        clock = Clock()
        pool = ready_pool(clock, engine=VLLM, workers=2, max_queue=1)
        await take_now(pool)
        clock.advance(4.0)
        await take_now(pool)
        clock.advance(2.0)

        with pytest.raises(PoolFull) as refused:
            await pool.acquire(MODEL, (), within=60)

        # Held 6 s so far and still running: at least 6 s per request, over two slots.
        assert refused.value.retry_after == pytest.approx(3.0)

    run(story)


@pytest.mark.parametrize(("drain", "ahead", "slots", "oldest", "wait"), [
    pytest.param(Pace(gap=2.0, hold=30.0), 3, 2, 0.0, 8.0, id="saturated pace wins"),
    pytest.param(Pace(hold=6.0), 0, 2, 50.0, 3.0, id="hold time over slots"),
    pytest.param(Pace(), 1, 1, 5.0, 10.0, id="nothing finished: the oldest's age"),
])
def test_the_expected_wait_uses_the_best_measure_there_is(drain: Pace, ahead: int, slots: int,
                                                           oldest: float, wait: float) -> None:
    assert drain.expected_wait(ahead, slots, oldest) == pytest.approx(wait)


def test_a_release_while_idle_is_no_measure_of_the_lines_pace() -> None:
    clock = Clock()
    drain = Pace(clock)
    drain.released(1.0, saturated=True)
    clock.advance(100.0)  # an idle hour is not a slow line
    drain.released(1.0, saturated=False)
    clock.advance(0.5)
    drain.released(1.0, saturated=True)

    assert drain.gap is None and drain.hold == pytest.approx(1.0)
    clock.advance(2.0)
    drain.released(1.0, saturated=True)
    assert drain.gap == pytest.approx(2.0)


def test_vllm_queues_itself_so_the_pool_sends_every_request_on() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), engine=VLLM)
        slots = [await take_now(pool) for _ in range(50)]

        assert pool.max_queue is None and len(slots) == 50
        assert pool.line.waiting() == 0

    run(story)


def test_a_reload_that_raises_max_queue_serves_the_line_at_once() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), engine=VLLM, max_queue=1)
        await take_now(pool)
        with pytest.raises(PoolFull):
            await pool.acquire(MODEL, (), within=60)

        pool.update(read_settings({"type": "pool", "max_queue": 2,
                                   "models": {MODEL: {"source": "/m.gguf"}}}))
        assert await pool.acquire(MODEL, (), within=60) is not None

    run(story)


def test_with_its_only_worker_benched_a_request_fails_over_rather_than_wait() -> None:
    async def story() -> None:
        pool = ready_pool(Clock(), max_queue=4)
        await take_now(pool)
        await take_now(pool)
        pool.suspect(pool.workers["local-0"])

        assert await pool.acquire(MODEL, (), within=60) is None, "not ready: the next provider"

    run(story)


def test_waiters_for_a_model_nobody_serves_any_more_are_told_at_once() -> None:
    async def story() -> None:
        line: Line[str] = Line(Clock())
        gone = asyncio.create_task(line.wait(MODEL, 60, lambda _: None))
        other = asyncio.create_task(line.wait("other", 60, lambda _: None))
        await settled()

        line.abandon(MODEL, PoolNotReady("pool local: no ready worker"))
        await settled()

        with pytest.raises(PoolNotReady):
            gone.result()
        assert not other.done() and line.waiting() == 1
        other.cancel()
        await settled()

    run(story)
