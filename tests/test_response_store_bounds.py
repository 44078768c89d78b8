"""The responses store is bounded by bytes: no client can fill the gateway's memory with stored
responses, a conversation costs each turn once, and what cannot be kept is said, not hidden."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from gateway.adapters.responses.store import ResponseStore, StoredTurn
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream


def _respond(gateway: GatewayProcess, **body: Any) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/responses", json={"model": "m", **body}, timeout=30)


def _turn(text: str, previous: str | None = None) -> StoredTurn:
    return StoredTurn([{"role": "user", "content": text}], previous)


def test_a_chain_stores_each_turn_once_and_rebuilds_the_whole_conversation() -> None:
    store = ResponseStore()

    async def story() -> tuple[list[int], list[dict[str, Any]] | None]:
        sizes = []
        previous = None
        for number in range(50):
            encoded = store.encode(_turn("x" * 1000 + str(number), previous))
            assert encoded is not None
            await store.put(f"r{number}", encoded)
            sizes.append(store.bytes)
            previous = f"r{number}"
        return sizes, await store.get("r49")

    sizes, history = asyncio.run(story())

    growth = {b - a for a, b in itertools.pairwise(sizes)}
    assert max(growth) < 1100, "each turn costs its own size, not the history again"
    assert history is not None and len(history) == 50
    assert history[0]["content"].endswith("x0") and history[-1]["content"].endswith("x49")


def test_the_oldest_turns_are_evicted_past_the_byte_bound_and_a_broken_chain_is_a_miss() -> None:
    store = ResponseStore(max_bytes=10_000, max_entry_bytes=5_000)

    async def story() -> tuple[Any, ...]:
        previous = None
        for number in range(30):
            encoded = store.encode(_turn("y" * 900, previous))
            assert encoded is not None
            await store.put(f"r{number}", encoded)
            previous = f"r{number}"
        return store.bytes, await store.get("r29"), await store.get("r0")

    held, history, oldest = asyncio.run(story())

    assert held <= 10_000
    assert oldest is None
    assert history is None, "an evicted ancestor is a miss, not a shortened conversation"
    assert store.encode(_turn("z" * 6_000)) is None  # over max_entry_bytes: not stored


def test_a_conversation_in_use_keeps_its_first_turn_while_idle_ones_are_evicted() -> None:
    store = ResponseStore(max_bytes=20_000, max_entry_bytes=5_000)

    async def story() -> tuple[Any, Any]:
        encoded = store.encode(_turn("first turn " + "w" * 900))
        assert encoded is not None
        await store.put("root", encoded)
        for number in range(60):  # other clients' turns, each continued check of the root
            other = store.encode(_turn("v" * 900))
            assert other is not None
            await store.put(f"other{number}", other)
            assert await store.get("root") is not None, f"root evicted after {number} others"
        return await store.get("root"), await store.get("other0")

    root, idle = asyncio.run(story())

    assert root is not None and root[0]["content"].startswith("first turn")
    assert idle is None  # nobody continued it: evicted first


def test_a_stored_chain_that_loops_is_a_miss() -> None:
    store = ResponseStore()

    async def story() -> Any:
        for this, previous in (("a", "b"), ("b", "a")):
            encoded = store.encode(_turn(this, previous))
            assert encoded is not None
            await store.put(this, encoded)
        return await store.get("a")

    assert asyncio.run(story()) is None


@pytest.fixture
def small_store(start_gateway: Callable[..., GatewayProcess],
                upstream_factory: Callable[[str], FakeUpstream]) -> GatewayProcess:
    up = upstream_factory("chat")
    return start_gateway(config({"chat": provider(up.base_url, {"m": "m"})},
                                responses={"store_max_bytes": 60_000,
                                           "store_max_entry_bytes": 20_000}))


def test_a_response_too_large_to_keep_says_store_false_and_cannot_be_continued(
        small_store: GatewayProcess) -> None:
    big = _respond(small_store, input="a" * 30_000)
    small = _respond(small_store, input="hello")

    assert big.status_code == 200 and big.json()["store"] is False
    assert small.json()["store"] is True
    follow_big = _respond(small_store, input="more", previous_response_id=big.json()["id"])
    follow_small = _respond(small_store, input="more", previous_response_id=small.json()["id"])
    assert follow_big.status_code == 404
    assert follow_big.json()["error"]["code"] == "response_not_found"
    assert follow_small.status_code == 200


def test_a_streamed_response_too_large_to_keep_says_so_from_response_created(
        small_store: GatewayProcess) -> None:
    with httpx.stream("POST", f"{small_store.base_url}/responses", timeout=30,
                      json={"model": "m", "input": "b" * 30_000, "stream": True}) as response:
        text = response.read().decode()

    created = next(line for line in text.splitlines() if '"response.created"' in line)
    completed = next(line for line in text.splitlines() if '"response.completed"' in line)
    assert '"store":false' in created.replace(" ", ""), "the input alone is already too large"
    assert '"store":false' in completed.replace(" ", "")


def test_many_large_responses_keep_memory_bounded_oldest_forgotten_newest_continued(
        small_store: GatewayProcess) -> None:
    ids = [_respond(small_store, input=f"{n}" + "c" * 15_000).json()["id"] for n in range(12)]

    oldest = _respond(small_store, input="more", previous_response_id=ids[0])
    newest = _respond(small_store, input="more", previous_response_id=ids[-1])

    assert oldest.status_code == 404
    assert newest.status_code == 200


def test_a_malformed_stored_response_in_redis_is_a_miss_not_a_500(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], redis_server: Any) -> None:
    up = upstream_factory("chat")
    gateway = start_gateway(config({"chat": provider(up.base_url, {"m": "m"})},
                                   state={"backend": "redis", "url": redis_server.url}))
    client = redis.Redis.from_url(redis_server.url)
    for value in (b"not json", b'{"messages": "x"}', b"[1, 2]",
                  # JSON of the right outline, but no chat messages: never sent upstream
                  b'{"messages": [{"role": "user", "content": {}}]}',
                  b'{"messages": [{"content": "no role"}]}',
                  b'{"messages": [{"role": "assistant", "tool_calls": "x"}]}',
                  b'{"messages": [], "previous": 5}'):
        client.set("llms-gateway:response:resp_planted", value)

        follow = _respond(gateway, input="more", previous_response_id="resp_planted")

        assert follow.status_code == 404, follow.text
        assert follow.json()["error"]["code"] == "response_not_found"
    client.close()
