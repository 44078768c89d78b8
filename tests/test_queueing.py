"""At the concurrency limit requests queue instead of hitting a 503 wall: through real sockets
against `gateway serve`, with a fake upstream that holds every request until the test lets go.

The order requests start in is what the fake upstream records on arrival, so the stories assert
on order and counts, never on times: batch and interactive keys sharing ten slots, deadlines
refused early or timed out (never answered late), a full queue, bad headers, a client that
leaves while it waits.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
from collections.abc import Callable
from typing import Any

import httpx

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, held

BATCH_KEY, CHAT_KEY = "sk-batch-key-0123456789", "sk-chat-key-0123456789"
KEYS = [{"key": BATCH_KEY, "id": "batch"},
        {"key": CHAT_KEY, "id": "interactive", "priority": 5, "max_priority": 10}]


def queueing_gateway(start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
                     **server: Any) -> GatewayProcess:
    upstream.set_mode(held())
    return start_gateway(config({"up": provider(upstream.base_url, {"m": "m"},
                                                timeouts={"first_token": 60, "total": 120})},
                                server={"api_keys": KEYS, **server}))


def body(name: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": name}]}


def started(upstream: FakeUpstream) -> list[str]:
    """Who reached the upstream, in the order they did."""
    return [r.json["messages"][0]["content"] for r in upstream.requests
            if r.path.endswith("/chat/completions")]


def queue(gateway: GatewayProcess) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{gateway.url}/status.json",
                                      headers={"Authorization": f"Bearer {BATCH_KEY}"}).json()
    return found["queue"]


async def ask(client: httpx.AsyncClient, gateway: GatewayProcess, key: str, name: str,
              **headers: str) -> httpx.Response:
    return await client.post(f"{gateway.base_url}/chat/completions", json=body(name),
                             headers={"Authorization": f"Bearer {key}", **headers})


def test_an_interactive_key_is_served_ahead_of_a_batch_burst_and_nobody_is_starved(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("held")
    gateway = queueing_gateway(start_gateway, upstream, max_concurrency=10, max_queue=500)

    async def story() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            first = [asyncio.create_task(ask(client, gateway, BATCH_KEY, f"batch-{n}"))
                     for n in range(10)]
            await asyncio.to_thread(wait_until, lambda: len(upstream.requests) == 10)
            rest = [asyncio.create_task(ask(client, gateway, BATCH_KEY, f"batch-{n}"))
                    for n in range(10, 200)]
            # Half the interactive key's requests ask for more than its default priority.
            rest += [asyncio.create_task(ask(client, gateway, CHAT_KEY, f"chat-{n}",
                                             **({"x-llms-priority": "9"} if n % 2 else {})))
                     for n in range(20)]
            await asyncio.to_thread(wait_until, lambda: queue(gateway)["depth"] == 210, 60)
            upstream.release()
            return await asyncio.gather(*first, *rest)

    answers = asyncio.run(story())

    assert [a.status_code for a in answers] == [200] * 220  # nobody starved
    order = started(upstream)
    assert sorted(order) == sorted([f"batch-{n}" for n in range(200)]
                                   + [f"chat-{n}" for n in range(20)])
    queued = order[10:]  # the first ten took the free slots
    chat = [i for i, name in enumerate(queued) if name.startswith("chat-")]
    batch = [i for i, name in enumerate(queued) if name.startswith("batch-")]
    # Fair turns between the keys: every interactive request starts before the batch's median.
    assert max(chat) < statistics.median(batch)
    assert max(chat) < 40  # one turn each: the twenty chats within the first forty starts
    # Within the interactive key, the higher priority first.
    chats = [name for name in queued if name.startswith("chat-")]
    assert {int(n.split("-")[1]) % 2 for n in chats[:10]} == {1}
    wait_until(lambda: queue(gateway)["running"] == 0)  # every slot given back
    status = queue(gateway)
    assert (status["depth"], status["dropped"]) == (0, {})
    metrics = httpx.get(f"{gateway.url}/metrics",
                        headers={"Authorization": f"Bearer {BATCH_KEY}"}).text
    assert 'llms_queue_wait_seconds_count{key="interactive"} 20.0' in metrics
    assert 'llms_queue_wait_seconds_count{key="batch"} 200.0' in metrics
    assert "llms_queue_depth 0.0" in metrics
    lines = gateway.wait_for_log("request", 220, timeout=30)
    assert sum("queued_ms" in line for line in lines) == 210  # those that waited say how long


def test_a_tiny_deadline_is_refused_early_or_times_out_never_answered_late(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("held")
    gateway = queueing_gateway(start_gateway, upstream, max_concurrency=2)

    async def story() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            holders = [asyncio.create_task(ask(client, gateway, BATCH_KEY, f"held-{n}"))
                       for n in range(2)]
            await asyncio.to_thread(wait_until, lambda: len(upstream.requests) == 2)
            tiny = await ask(client, gateway, CHAT_KEY, "tiny", **{"x-llms-timeout": "0.2"})
            none = await ask(client, gateway, CHAT_KEY, "none", **{"x-llms-timeout": "0"})
            upstream.release()
            return await asyncio.gather(*holders), tiny, none

    holders, tiny, none = asyncio.run(story())

    assert [h.status_code for h in holders] == [200, 200]
    # Nothing freed a slot while they could wait: an early 503 or a 504, never an answer.
    assert tiny.status_code in (503, 504)
    assert tiny.json()["error"]["code"] == {503: "overloaded", 504: "queue_timeout"}[
        tiny.status_code]
    assert none.status_code == 503 and none.json()["error"]["code"] == "overloaded"
    assert int(none.headers["retry-after"]) >= 1
    assert sorted(started(upstream)) == ["held-0", "held-1"]
    assert sum(queue(gateway)["dropped"].values()) == 2


def test_a_full_queue_is_a_503_with_when_to_come_back(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("held")
    gateway = queueing_gateway(start_gateway, upstream, max_concurrency=1, max_queue=2)

    async def story() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            holder = asyncio.create_task(ask(client, gateway, BATCH_KEY, "holder"))
            await asyncio.to_thread(wait_until, lambda: len(upstream.requests) == 1)
            waiting = [asyncio.create_task(ask(client, gateway, BATCH_KEY, f"waiting-{n}"))
                       for n in range(2)]
            await asyncio.to_thread(wait_until, lambda: queue(gateway)["depth"] == 2)
            refused = await ask(client, gateway, CHAT_KEY, "refused")
            upstream.release()
            return await asyncio.gather(holder, *waiting), refused

    served, refused = asyncio.run(story())

    assert [r.status_code for r in served] == [200, 200, 200]
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "overloaded"
    assert "queue is full" in refused.json()["error"]["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert queue(gateway)["dropped"] == {"full": 1}
    metrics = httpx.get(f"{gateway.url}/metrics",
                        headers={"Authorization": f"Bearer {BATCH_KEY}"}).text
    assert 'llms_queue_dropped_total{key="interactive",reason="full"} 1.0' in metrics


BAD_HEADERS = [("x-llms-priority", "urgent"), ("x-llms-priority", "2.5"),
               ("x-llms-timeout", "-3"), ("x-llms-timeout", "later")]


def test_a_bad_queue_header_is_a_400_naming_it(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("ok")
    gateway = start_gateway(config({"up": provider(upstream.base_url, {"m": "m"})}))

    answers = [httpx.post(f"{gateway.base_url}/chat/completions", json=body("x"),
                          headers={header: value}) for header, value in BAD_HEADERS]

    assert [a.status_code for a in answers] == [400] * len(BAD_HEADERS)
    assert [a.json()["error"]["param"] for a in answers] == [h for h, _ in BAD_HEADERS]
    assert upstream.requests == []


def test_a_client_that_leaves_while_queued_leaves_the_queue(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("held")
    gateway = queueing_gateway(start_gateway, upstream, max_concurrency=1)
    holder_done: list[int] = []

    def hold() -> None:
        holder_done.append(httpx.post(f"{gateway.base_url}/chat/completions", json=body("holder"),
                                      headers={"Authorization": f"Bearer {BATCH_KEY}"},
                                      timeout=60).status_code)

    async def story() -> None:
        holding = asyncio.create_task(asyncio.to_thread(hold))
        await asyncio.to_thread(wait_until, lambda: len(upstream.requests) == 1)
        payload = b'{"model": "m", "messages": [{"role": "user", "content": "leaver"}]}'
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                         b"Authorization: Bearer " + CHAT_KEY.encode() + b"\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
                         + payload)
            await asyncio.to_thread(wait_until, lambda: queue(gateway)["depth"] == 1)
        await asyncio.to_thread(wait_until, lambda: queue(gateway)["depth"] == 0)
        upstream.release()
        await holding

    asyncio.run(story())

    assert holder_done == [200]
    assert queue(gateway)["dropped"] == {"client_left": 1}
    assert started(upstream) == ["holder"]  # the leaver never reached the upstream
