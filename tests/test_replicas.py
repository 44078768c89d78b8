"""What workers and replicas share: a gateway is one gateway, however many processes serve it.

The first key made on one worker closes every worker before the admin's answer is back; a retry
with the same `Idempotency-Key` on another replica waits for the first's answer instead of
running (and billing) it again; a key's parallel slot held by a process that was killed is free
again within its lease, while a slot whose request still runs is kept.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis.asyncio import Redis

from gateway.accounts.account import Slots
from gateway.accounts.file_ledger import FileLedger
from gateway.accounts.ledger import Hold, Ledger, Over, RedisLedger
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, held, ok

MESSAGES = [{"role": "user", "content": "hello"}]


def chat(gateway: GatewayProcess, key: str | None = None, idempotency: str | None = None,
         **extra: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if idempotency is not None:
        headers["Idempotency-Key"] = idempotency
    with httpx.Client(timeout=20) as client:  # a connection of its own: any worker may take it
        return client.post(f"{gateway.base_url}/chat/completions", headers=headers,
                           json={"model": "m", "messages": MESSAGES, **extra})


def pids(gateway: GatewayProcess, status: int) -> set[int]:
    """The workers that answered some request with `status`, by the request log."""
    return {line["pid"] for line in gateway.log_events("request") if line["status"] == status}


@contextlib.contextmanager
def running(*gateways: GatewayProcess) -> Iterator[None]:
    """The gateways started (several workers take a while), stopped however the story ends."""
    try:
        for gateway in gateways:
            gateway.start(timeout=60)
        yield
    finally:
        for gateway in gateways:
            gateway.stop()


def test_the_first_key_made_on_one_worker_closes_every_worker_at_once(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("billing")
    # Workers read the directory again only every 5 s: nothing but the request itself can
    # tell a worker that did not make the key that one exists.
    doc = config({"main": provider(upstream.base_url, {"m": "m"})},
                 database={"poll_interval": 5})
    gateway = GatewayProcess(tmp_path, doc, extra_args=("--workers", "2"))
    with running(gateway):
        story_of_the_first_key(gateway, upstream)


def story_of_the_first_key(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    wait_until(lambda: chat(gateway).status_code == 200 and len(pids(gateway, 200)) == 2,
               within=30, what="both workers serving without keys")
    served = len(upstream.requests)

    made = httpx.post(f"{gateway.url}/admin/keys", json={"name": "first"}, timeout=10)
    assert made.status_code == 201, made.text
    answers = [chat(gateway).status_code for _ in range(30)]

    assert answers == [401] * 30, "no request without a key is served once the admin has one"
    assert len(upstream.requests) == served, "nothing went upstream uncharged"
    wait_until(lambda: len(pids(gateway, 401)) == 2, what="both workers refusing")
    assert chat(gateway, made.json()["key"]).status_code == 200


def replicas(tmp_path: Path, upstreams: list[FakeUpstream], redis: RedisServer,
             **sections: Any) -> tuple[GatewayProcess, GatewayProcess]:
    """Two gateways as two replicas run them: one accounts database, one Redis; the model
    `m` served by the first upstream, `k` by the second."""
    doc = config({"main": provider(upstreams[0].base_url, {"m": "m"}),
                  "other": provider(upstreams[-1].base_url, {"k": "k"})},
                 database={"url": f"sqlite:///{tmp_path / 'accounts.db'}", **sections.pop(
                     "database", {})},
                 state={"backend": "redis", "url": redis.url}, **sections)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    return GatewayProcess(tmp_path / "one", doc), GatewayProcess(tmp_path / "two", doc)


def in_background(call: Callable[[], httpx.Response]) -> concurrent.futures.Future[Any]:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def inflight(gateway: GatewayProcess) -> int:
    """Requests in the gateway, as its /ready shows them (to anyone, with no key made)."""
    count: int = httpx.get(f"{gateway.url}/ready", timeout=5).json()["inflight"]
    return count


def hold_deadlines(server: RedisServer) -> list[int]:
    """The deadlines, in whole seconds, of the holds in the shared ledger (a parallel slot is
    one): what a lease's renewals move on."""
    with redis.Redis.from_url(server.url) as client:
        return [int(value.rpartition(b":")[2])
                for key in client.scan_iter(match="llms-gateway:budget:*")
                for field, value in client.hgetall(key).items() if field.startswith(b"h:")]


def claim_renewals(server: RedisServer) -> Callable[[], int]:
    """A count of the renewals of the one idempotency claim in Redis so far, each seen as its
    time to live going back up between two looks (a look missed only delays the count)."""
    seen = {"ttl": 0, "renewals": 0}

    def count() -> int:
        with redis.Redis.from_url(server.url) as client:
            ttl = max((client.pttl(key) for key in
                       client.scan_iter(match="llms-gateway:idempotency-claim:*")), default=0)
        if ttl > seen["ttl"] > 0:
            seen["renewals"] += 1
        seen["ttl"] = ttl
        return seen["renewals"]
    return count


def test_a_killed_replica_s_parallel_slot_is_free_again_within_its_lease(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream],
        redis_server: RedisServer) -> None:
    first, second = upstream_factory("first"), upstream_factory("second")
    one, two = replicas(tmp_path, [first, second], redis_server,
                        database={"parallel_lease": 1})
    with running(one, two):
        made = httpx.post(f"{one.url}/admin/keys", json={"name": "one-at-a-time",
                                                         "max_parallel": 1}, timeout=10)
        key = made.json()["key"]
        wait_until(lambda: chat(two).status_code == 401, what="the key known to both")
        assert chat(two, key, model="k").status_code == 200

        first.set_mode(held())
        running_on_two = in_background(lambda: chat(two, key))
        wait_until(lambda: first.requests, what="a request running on two")
        first_deadline = min(wait_until(lambda: hold_deadlines(redis_server),
                                        what="its slot held in Redis"))
        # A renewal two seconds past the first deadline was made once that deadline had come:
        # unrenewed, the slot would be free by now. It is held as long as the request runs.
        wait_until(lambda: min(hold_deadlines(redis_server), default=0) >= first_deadline + 2,
                   within=30, what="its slot's lease renewed past its first deadline")
        assert chat(one, key, model="k").status_code == 429
        first.release()
        assert running_on_two.result(timeout=10).status_code == 200

        second.set_mode(held())
        killed = in_background(lambda: chat(one, key, model="k"))
        wait_until(lambda: len(second.requests) == 2, what="a request running on one")
        assert chat(two, key).status_code == 429, "one request at a time, across replicas"
        os.killpg(one.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
        one.process.wait()  # type: ignore[union-attr]

        wait_until(lambda: chat(two, key).status_code == 200, within=10,
                   what="the killed replica's slot free again after about its lease")
        assert isinstance(killed.exception(timeout=10), httpx.HTTPError)



@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_on_another_replica_waits_for_the_first_answer_and_is_not_billed_again(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream],
        redis_server: RedisServer, stream: bool) -> None:
    upstream = upstream_factory("billed")
    one, two = replicas(tmp_path, [upstream], redis_server)
    with running(one, two):
        upstream.set_mode(held(ok("the one answer")))
        first = in_background(lambda: chat(one, idempotency="retried", stream=stream))
        wait_until(lambda: upstream.requests, what="the first running on one")
        retry = in_background(lambda: chat(two, idempotency="retried", stream=stream))
        joined = in_background(lambda: chat(one, idempotency="retried", stream=stream))
        other = chat(two, idempotency="retried", stream=stream,
                     messages=[{"role": "user", "content": "other"}])
        assert other.status_code == 422, "another body under the key, on any replica"
        wait_until(lambda: inflight(two) == 1, within=30, what="the retry in flight on two")
        assert not retry.done()
        upstream.release()

        answered, replayed = first.result(timeout=20), retry.result(timeout=20)
        assert answered.status_code == replayed.status_code == 200, replayed.text
        assert replayed.content == answered.content == joined.result(timeout=20).content
        assert replayed.headers["x-llms-idempotent-replay"] == "true"
        assert len(upstream.requests) == 1, "run and billed once"


def test_a_retry_waiting_on_a_killed_replica_runs_the_request_once_its_claim_lapses(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream],
        redis_server: RedisServer) -> None:
    first, second = upstream_factory("first"), upstream_factory("second")
    one, two = replicas(tmp_path, [first, second], redis_server, idempotency={"lease": 1})
    with running(one, two):
        first.set_mode(held())
        killed = in_background(lambda: chat(one, idempotency="lapsing"))
        wait_until(lambda: first.requests, what="the first running on one")
        retry = in_background(lambda: chat(two, idempotency="lapsing"))
        wait_until(lambda: inflight(two) == 1, within=30, what="the retry in flight on two")
        # Renewed a third of its lease apart: three renewals seen, a whole lease has passed
        # since the claim was taken; unrenewed, it would have lapsed and two would have run it.
        renewals = claim_renewals(redis_server)
        wait_until(lambda: renewals() >= 3, within=30,
                   what="one's claim renewed three times while it runs the request")
        assert not retry.done() and len(first.requests) == 1
        os.killpg(one.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
        one.process.wait()  # type: ignore[union-attr]
        first.release()

        ran = retry.result(timeout=15)
        assert ran.status_code == 200, ran.text
        assert "x-llms-idempotent-replay" not in ran.headers, "its own run, not a replay"
        assert len(first.requests) == 2
        assert isinstance(killed.exception(timeout=10), httpx.HTTPError)


ONE_AT_A_TIME = Slots("key", "key_a", 1)
LEASE = 10.0


def nothing_before(scope_id: str, start: float) -> float:
    return 0.0


async def lease_story(ledgers: list[Ledger]) -> None:
    """On an injected clock: a slot renewed while its request runs stays held past its lease;
    one its process no longer renews is taken by another process after about the lease."""
    first, second = ledgers[0], ledgers[-1]
    held = await first.reserve([ONE_AT_A_TIME], 1, nothing_before, 1000.0, LEASE)
    assert isinstance(held, Hold)
    for now in (1004.0, 1008.0, 1012.0, 1016.0):  # renewed, a third of the lease apart
        await first.renew([held], now, LEASE)
        assert isinstance(await second.reserve([ONE_AT_A_TIME], 1, nothing_before, now + 1,
                                               LEASE), Over)
    # Its process is gone: nothing renews it.
    assert isinstance(await second.reserve([ONE_AT_A_TIME], 1, nothing_before, 1020.0, LEASE),
                      Over)
    taken = await second.reserve([ONE_AT_A_TIME], 1, nothing_before, 1016.0 + LEASE + 2,
                                 LEASE)
    assert isinstance(taken, Hold), "free again within about the lease, not an hour"


def test_slot_leases_on_the_machine_s_file(tmp_path: Path) -> None:
    ledgers = [FileLedger(tmp_path / "budgets.sqlite3") for _ in range(2)]
    try:
        asyncio.run(lease_story(list(ledgers)))
    finally:
        for ledger in ledgers:
            ledger.close()


def test_slot_leases_in_redis(redis_server: RedisServer) -> None:
    async def story() -> None:
        clients = [Redis.from_url(redis_server.url) for _ in range(2)]
        try:
            await lease_story([RedisLedger(client, "test:") for client in clients])
        finally:
            for client in clients:
                await client.aclose()
    asyncio.run(story())
