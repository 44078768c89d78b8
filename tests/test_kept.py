"""What the gateway keeps between requests (`gateway.stores.kept`): bounded by bytes in each
process, shared through Redis by every process, through the process's one Redis client."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis

from gateway.core.settings import StateConfig
from gateway.state.redis_sync import redis_client
from gateway.stores.kept import Kept
from tests.gateway_process import ROOT, GatewayProcess, config, provider, wait_until
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream


def test_values_past_the_byte_bound_go_least_recently_used_first() -> None:
    kept = Kept(max_bytes=300, max_entry_bytes=100)

    async def story() -> tuple[bytes | None, ...]:
        for key in "abc":
            assert await kept.put(key, key.encode() * 100, ttl=60)
        await kept.get("a")  # read: now the most recently used
        await kept.put("d", b"d" * 100, ttl=60)
        return tuple([await kept.get(key) for key in "abcd"])

    a, b, c, d = asyncio.run(story())

    assert kept.bytes == 300
    assert b is None, "the least recently used went first"
    assert a is not None and c is not None and d is not None


def test_a_value_larger_than_an_entry_may_be_is_kept_nowhere() -> None:
    kept = Kept(max_bytes=1_000, max_entry_bytes=100)

    assert not asyncio.run(kept.put("big", b"x" * 101, ttl=60))
    assert kept.bytes == 0 and asyncio.run(kept.get("big")) is None
    assert Kept(max_bytes=50, max_entry_bytes=100).max_entry_bytes == 50, \
        "no entry larger than the whole store, which would evict everything else"


def test_without_redis_the_latest_value_is_this_process_s_and_delete_says_if_it_held_it() -> None:
    kept = Kept(max_bytes=1_000, max_entry_bytes=100)

    async def story() -> tuple[Any, ...]:
        await kept.put("k", b"value", ttl=60)
        latest = await kept.latest("k")
        return latest, await kept.delete("k"), await kept.delete("k"), await kept.get("k")

    assert asyncio.run(story()) == (b"value", True, False, None)
    assert kept.bytes == 0


def test_processes_sharing_a_redis_read_each_other_s_values_and_deletes(
        redis_server: RedisServer) -> None:
    async def story() -> dict[str, Any]:
        one_client, two_client = (aioredis.from_url(redis_server.url) for _ in range(2))
        one = Kept(10_000, 1_000, one_client, "test:")
        two = Kept(10_000, 1_000, two_client, "test:")
        seen: dict[str, Any] = {}
        await one.put("k", b"from one", ttl=60)
        seen["read"] = await two.get("k")
        seen["held_by_two"] = two.bytes
        seen["deleted"] = await two.delete("k")
        seen["latest_at_one"] = await one.latest("k")
        seen["held_by_one"] = one.bytes
        seen["ttl_ms"] = await one_client.pttl("test:k")
        await one.put("brief", b"v", ttl=0.5)
        seen["brief_ttl_ms"] = await one_client.pttl("test:brief")
        await one.put("expired", b"v", ttl=-1)
        seen["expired_in_redis"] = await one_client.exists("test:expired")
        await one_client.set("test:huge", b"x" * 1_001)
        seen["huge"] = await one.get("huge")
        await one_client.aclose()
        await two_client.aclose()
        return seen

    seen = asyncio.run(story())

    assert seen["read"] == b"from one"
    assert seen["held_by_two"] == 0, "a value read from Redis is held only once it is kept"
    assert seen["deleted"] is True
    assert seen["latest_at_one"] is None and seen["held_by_one"] == 0, \
        "deleted by another process: gone here too"
    assert seen["ttl_ms"] == -2, "deleted keys have no TTL"
    assert 0 < seen["brief_ttl_ms"] <= 500
    assert seen["expired_in_redis"] == 0, "nothing left to live: not written to Redis"
    assert seen["huge"] is None, "a value in Redis larger than an entry is a miss"


def test_redis_going_away_leaves_this_process_s_copies_serving(
        redis_server: RedisServer) -> None:
    async def story() -> tuple[Any, ...]:
        client = aioredis.from_url(redis_server.url, socket_timeout=1.0,
                                   socket_connect_timeout=1.0)
        kept = Kept(10_000, 1_000, client, "test:")
        await kept.put("k", b"before", ttl=60)
        redis_server.stop()
        answers = (await kept.put("later", b"after", ttl=60), await kept.get("k"),
                   await kept.latest("later"), await kept.get("nowhere"),
                   await kept.delete("k"))
        await client.aclose()
        return answers

    assert asyncio.run(story()) == (True, b"before", b"after", None, True)


def test_a_process_has_one_redis_client_only_with_the_redis_backend_closed_on_leaving(
        redis_server: RedisServer) -> None:
    async def story() -> tuple[Any, ...]:
        async with redis_client(StateConfig()) as none:
            pass
        async with redis_client(StateConfig(backend="redis", url=redis_server.url)) as client:
            assert client is not None
            answered = await client.ping()
        return none, answered

    assert asyncio.run(story()) == (None, True)
    observer = redis.Redis.from_url(redis_server.url)
    own = str(observer.client_id())
    wait_until(lambda: [c for c in observer.client_list() if c["id"] != own] == [])
    observer.close()


def test_only_the_lifespan_s_redis_client_is_ever_built() -> None:
    builds = [(path.relative_to(ROOT), n) for folder in ("gateway", "providers")
              for path in sorted((ROOT / folder).rglob("*.py"))
              for n, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r"\bfrom_url\(|\bRedis\(|\bStrictRedis\(", line)]

    assert [str(path) for path, _ in builds] == ["gateway/state/redis_sync.py"], builds


def test_a_gateway_shares_state_caches_and_stores_responses_through_one_redis_client(
        start_gateway: Callable[..., GatewayProcess], redis_server: RedisServer,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("chat")
    gateway = start_gateway(config(
        {"chat": provider(up.base_url, {"m": "m"})}, models={"m": {"cache": {"ttl": 60}}},
        state={"backend": "redis", "url": redis_server.url, "sync_interval": 0.2}))
    gateway.wait_for_log("shared_state_connected")
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):  # a cache write, then a hit
        assert httpx.post(f"{gateway.base_url}/chat/completions", json=chat).status_code == 200
    first = httpx.post(f"{gateway.base_url}/responses", json={"model": "m", "input": "hi"})
    follow = httpx.post(f"{gateway.base_url}/responses", json={
        "model": "m", "input": "more", "previous_response_id": first.json()["id"]})
    assert follow.status_code == 200

    client = redis.Redis.from_url(redis_server.url)
    own = str(client.client_id())
    wait_until(lambda: client.exists("llms-gateway:latency"), what="a sync writing latencies")
    connections = [c for c in client.client_list() if c["id"] != own]
    keys = {key.decode().split(":")[1] for key in client.keys("llms-gateway:*")}
    client.close()

    assert {"cache", "response", "latency"} <= keys, keys  # latency: written by the sync
    # One client: requests here come one at a time, so its pool holds one connection, or
    # two when a sync overlapped a request; three clients held at least three.
    assert 1 <= len(connections) <= 2, connections
