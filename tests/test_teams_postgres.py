"""Teams on PostgreSQL, shared by replicas, beyond the stories `test_teams.py` runs on both
databases: a budget and a team's parallel limit two replicas share through Redis, and the database
stopped mid-load.

PostgreSQL is started here, on a free port, in a temporary directory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, wait_until
from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer
from tests.test_teams import MESSAGES, Admin, chat, keyed_everywhere, priced
from tests.upstream import FakeUpstream, held

pytestmark = pytest.mark.skipif(not PostgresServer.available(),
                                reason="PostgreSQL's binaries are not installed")


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.close()


@pytest.fixture
def upstream(upstream_factory: Callable[[str], FakeUpstream]) -> FakeUpstream:
    return upstream_factory("billing")


def shared(upstream: FakeUpstream, postgres: PostgresServer,
           redis: RedisServer | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"database": {"url": postgres.url}}
    if redis is not None:
        extra["state"] = {"backend": "redis", "url": redis.url, "sync_interval": 0.2}
    return priced(upstream, "m", **extra)


def test_two_replicas_together_never_overshoot_a_budget(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        postgres: PostgresServer, redis_server: RedisServer) -> None:
    replicas = [start_gateway(shared(upstream, postgres, redis_server)) for _ in range(2)]
    admin = Admin(replicas[0])
    made = admin.key(budget={"usd": 0.01, "period": "month"})
    clients = [openai.AsyncOpenAI(base_url=r.base_url, api_key=made["key"], max_retries=0)
               for r in replicas]
    keyed_everywhere(replicas[1])  # it learns of the key from the database

    async def one(client: openai.AsyncOpenAI) -> bool:
        try:
            stream = await client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=8, stream=True)
            async for _ in stream:
                pass
            return True
        except openai.RateLimitError as exc:
            assert exc.code == "budget_exceeded"
            return False

    async def rounds() -> list[bool]:
        results: list[bool] = []
        for _ in range(4):
            results += await asyncio.gather(
                *(one(c) for c in itertools.islice(itertools.cycle(clients), 50)))
        return results

    served = asyncio.run(rounds())
    assert any(served) and not all(served)
    spent = admin.spend()[made["id"]]
    assert 0 < spent["cost"] <= 0.01


def test_two_replicas_sharing_redis_share_a_team_s_max_parallel(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        postgres: PostgresServer, redis_server: RedisServer) -> None:
    replicas = [start_gateway(shared(upstream, postgres, redis_server)) for _ in range(2)]
    admin = Admin(replicas[0])
    admin.team(name="ops", max_parallel=2)
    secrets = [admin.key(name=n, team="ops")["key"] for n in ("a", "b")]
    keyed_everywhere(replicas[1])
    upstream.set_mode(held())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = [pool.submit(chat, replicas[i], secrets[i]) for i in range(2)]
        wait_until(lambda: len(upstream.requests) == 2)
        for replica, secret in itertools.product(replicas, secrets):
            refused = chat(replica, secret)  # the team's third, on either replica, either key
            assert refused.status_code == 429
            assert "Team ops has 2 requests in flight" in refused.json()["error"]["message"]
        upstream.release()
        assert [r.result().status_code for r in running] == [200, 200]
    assert len(upstream.requests) == 2
    wait_until(lambda: chat(replicas[1], secrets[0]).status_code == 200, within=5)


def test_the_database_stopped_mid_load_loses_no_spend_record(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        postgres: PostgresServer) -> None:
    gateway = start_gateway(shared(upstream, postgres))
    admin = Admin(gateway)
    secret = admin.key(name="steady")["key"]
    answered: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=20) as client:
            while not stop.is_set():
                answer = client.post(f"{gateway.base_url}/chat/completions",
                                     headers={"Authorization": f"Bearer {secret}"},
                                     json={"model": "m", "messages": MESSAGES})
                answered.append(answer.status_code)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        wait_until(lambda: len(answered) >= 20)
        postgres.stop()
        down_since = len(answered)
        wait_until(lambda: not database_status(gateway, secret)["up"], within=5)
        wait_until(lambda: len(answered) >= down_since + 20)  # known keys are still served
        refused = admin.call("POST", "/admin/keys", json={"name": "during-outage"})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "database_unavailable"
        assert database_status(gateway, secret)["buffered"] > 0
        postgres.start()
        wait_until(lambda: database_status(gateway, secret)["up"], within=10)
    finally:
        stop.set()
        worker.join()
    assert set(answered) == {200}
    wait_until(lambda: admin.call("GET", "/admin/spend").status_code == 200, within=10)
    assert admin.spend()[admin_key_id(admin, "steady")]["requests"] == len(answered)


def database_status(gateway: GatewayProcess, key: str) -> dict[str, Any]:
    status = httpx.get(f"{gateway.url}/status.json", timeout=5,
                       headers={"Authorization": f"Bearer {key}"}).json()
    return dict(status["database"])


def admin_key_id(admin: Admin, name: str) -> str:
    keys = admin.call("GET", "/admin/keys").json()["data"]
    return str(next(k["id"] for k in keys if k["name"] == name))
