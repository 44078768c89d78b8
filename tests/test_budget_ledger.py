"""The budget ledger's rules, without a gateway: holds all or none, settled to the real cost,
released when their request never came back, periods by the calendar; the same script on a real
Redis for replicas, the same file for two worker processes of one machine."""

from __future__ import annotations

import asyncio
import datetime as dt
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from gateway.accounts.account import NANO, Budget, Scope, window
from gateway.accounts.file_ledger import FileLedger
from gateway.accounts.ledger import HOLD_TTL, Hold, LocalLedger, Over, RedisLedger
from gateway.accounts.pricing import estimate, worst_case
from gateway.core.settings import Route
from providers.contract.usage import Price
from tests.redis_server import RedisServer

KEY = Scope("key", "key_a", Budget(1.0, "month"))
TEAM = Scope("team", "research", Budget(1.5, "month"))
NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC).timestamp()


def nothing_spent(scope_id: str, start: float) -> float:
    return 0.0


def test_periods_follow_the_utc_calendar() -> None:
    day = dt.datetime.fromtimestamp
    start, end = window("month", NOW)
    assert day(start, dt.UTC) == dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    assert end is not None and day(end, dt.UTC) == dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    start, _ = window("week", NOW)
    assert day(start, dt.UTC) == dt.datetime(2026, 11, 23, tzinfo=dt.UTC)  # a Monday
    assert window("total", NOW) == (0.0, None)
    december = dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC).timestamp()
    assert day(window("month", december)[1] or 0, dt.UTC).year == 2027


def test_holds_are_all_or_none_and_settle_to_the_real_cost() -> None:
    ledger = LocalLedger()
    first = ledger.reserve([KEY, TEAM], int(0.6 * NANO), nothing_spent, NOW)
    assert isinstance(first, Hold) and first.remaining == pytest.approx(0.4)
    # The key's budget cannot take a second 0.6: neither budget is held for it.
    refused = ledger.reserve([KEY, TEAM], int(0.6 * NANO), nothing_spent, NOW)
    assert isinstance(refused, Over) and refused.scope == KEY
    assert refused.spent == pytest.approx(0.6)
    ledger.settle(first, int(0.1 * NANO))  # it cost less than it might have
    second = ledger.reserve([KEY, TEAM], int(0.6 * NANO), nothing_spent, NOW)
    assert isinstance(second, Hold) and second.remaining == pytest.approx(0.3)
    ledger.settle(second, int(0.6 * NANO))
    ledger.settle(second, int(0.6 * NANO))  # a second settlement changes nothing
    counts = {entry[0]: ledger.counts[entry].spent for entry in ledger.counts}
    assert counts == {"key:key_a": int(0.7 * NANO), "team:research": int(0.7 * NANO)}


def test_a_hold_whose_request_never_ended_is_released_after_its_deadline() -> None:
    ledger = LocalLedger()
    assert isinstance(ledger.reserve([KEY], NANO, nothing_spent, NOW), Hold)
    assert isinstance(ledger.reserve([KEY], 1, nothing_spent, NOW + 60), Over)
    later = ledger.reserve([KEY], NANO, nothing_spent, NOW + HOLD_TTL + 1)
    assert isinstance(later, Hold)


def test_a_new_period_starts_from_what_the_database_says_it_spent() -> None:
    ledger = LocalLedger()
    known = {("key:key_a", window("month", NOW)[0]): 0.95}
    refused = ledger.reserve([KEY], int(0.1 * NANO),
                             lambda s, start: known.get((s, start), 0.0), NOW)
    assert isinstance(refused, Over) and refused.spent == pytest.approx(0.95)


def test_the_hold_is_the_dearest_candidates_price_for_the_longest_answer_allowed() -> None:
    routes = [("m", Route("cheap", "c")), ("m", Route("dear", "d", max_output_tokens=1000))]
    prices = {("cheap", "m"): Price(1.0, 1.0), ("dear", "m"): Price(10.0, 20.0)}
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}'
    need = estimate("chat/completions", body)
    assert need.prompt >= 10 and need.output == 100
    amount = worst_case("chat/completions", need, routes, prices)
    assert amount == pytest.approx((need.prompt * 10 + 100 * 20) / 1e6 * NANO, abs=1)
    unsaid = estimate("chat/completions", body.replace(b',"max_tokens":100', b""))
    assert worst_case("chat/completions", unsaid, routes, prices) > amount
    assert worst_case("chat/completions", need, routes, {}) == 1  # unpriced: a nano
    # A prompt may all be written to a prompt cache, at its dearer price.
    caching = {("dear", "m"): Price(10.0, 20.0, cache_write=12.5)}
    assert worst_case("chat/completions", need, routes, caching) \
        == pytest.approx((need.prompt * 12.5 + 100 * 20) / 1e6 * NANO, abs=1)


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    if not RedisServer.available():
        pytest.skip("redis-server is not installed")
    server = RedisServer().start()
    yield server
    server.stop()


def test_replicas_sharing_redis_hold_against_one_count(redis: RedisServer) -> None:
    # Redis expires a period's counts by its own clock (a week after the period ends): the
    # story's time must be the real one, or a fixed date's counts vanish once that week is past.
    now = time.time()

    async def story() -> None:
        clients = [Redis.from_url(redis.url) for _ in range(2)]
        replicas = [RedisLedger(client, "test:") for client in clients]
        holds = await asyncio.gather(*(replicas[i % 2].reserve([KEY, TEAM], int(0.3 * NANO),
                                                               nothing_spent, now)
                                       for i in range(5)))
        assert sum(isinstance(h, Hold) for h in holds) == 3  # 0.9 of the key's 1.0
        first = next(h for h in holds if isinstance(h, Hold))
        replicas[0].settle(first, int(0.05 * NANO))
        assert await replicas[0].flush()
        again = await replicas[1].reserve([KEY], int(0.3 * NANO), nothing_spent, now)
        assert isinstance(again, Hold) and again.remaining == pytest.approx(0.05)
        expired = await replicas[1].reserve([KEY], int(0.3 * NANO), nothing_spent,
                                            now + HOLD_TTL + 1)
        assert isinstance(expired, Hold)  # the holds that never settled were let go
        for client in clients:
            await client.aclose()

    asyncio.run(story())


def _worker_holds(path: str, started: float, tries: int) -> list[str]:
    """One worker of a machine without Redis: as many holds of $0.03 as its budget lets it."""
    ledger = FileLedger(Path(path))
    while time.time() < started:  # both workers begin together, to contend for the file
        pass
    held = [asyncio.run(ledger.reserve([KEY], int(0.03 * NANO), nothing_spent, NOW))
            for _ in range(tries)]
    ledger.close()
    return [hold.id for hold in held if isinstance(hold, Hold)]


def test_two_workers_of_one_machine_hold_against_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "budgets.sqlite3")
    with multiprocessing.get_context("fork").Pool(2) as workers:
        started = time.time() + 0.5
        results = workers.starmap(_worker_holds, [(path, started, 40), (path, started, 40)])
    # $1 takes 33 holds of $0.03, whichever worker asked: none more, none lost to contention.
    assert sum(len(ids) for ids in results) == 33
    again = FileLedger(Path(path))
    over = asyncio.run(again.reserve([KEY], int(0.03 * NANO), nothing_spent, NOW))
    assert isinstance(over, Over) and over.spent == pytest.approx(0.99)
    hold = asyncio.run(again.reserve([KEY], int(0.01 * NANO), nothing_spent, NOW))
    assert isinstance(hold, Hold)
    again.settle(hold, 0)  # released: the last cent is free again
    assert isinstance(asyncio.run(again.reserve([KEY], int(0.01 * NANO), nothing_spent, NOW)),
                      Hold)
    again.close()
