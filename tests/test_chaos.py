"""Providers failing at random under load: every request still ends well-formed, none hangs.

Three fake upstreams answer, refuse with 5xx/429, stall, cut streams, or send garbage at random.
2,000 requests at 100 concurrent clients, half streaming: each must end with a complete answer
(a stream with `[DONE]`) or an error envelope (a stream with an error event), never a gateway
500, never a hang; afterwards no request is left counted in flight.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import (
    FakeUpstream,
    chaos,
    invalid_json,
    ok,
    slow_first_token,
    sse_garbage,
    status,
    stream_cut,
)

REQUESTS = 2000
CONCURRENCY = 100


def chaotic(seed: int) -> object:
    return chaos(ok(), ok(), ok(), ok(), ok(delay_between_chunks=0.01), status(500), status(503),
                 status(429), slow_first_token(1.0), stream_cut(1),
                 invalid_json(), sse_garbage(), seed=seed)


def chaos_config(upstreams: list[FakeUpstream], **sections: object) -> dict:
    return config({
        up.name: provider(up.base_url, {"m": "m"},
                          timeouts={"first_token": 0.5, "idle": 1, "total": 5},
                          # Failing over half the time is the point here: a tolerant breaker
                          # keeps all three in play so most requests find a healthy try.
                          # (and a 429 without Retry-After cools a provider only briefly).
                          circuit={"failures": 10, "error_rate": 0.9, "open_for": 0.2,
                                   "max_open_for": 1, "rate_limit_cooldown": 0.05})
        for up in upstreams
    }, **sections)


def check_stream(text: str) -> str:
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events, f"empty stream: {text!r}"
    if events[-1] == "[DONE]":
        assert all("error" not in json.loads(e) for e in events[:-1])
        return "completed"
    last = json.loads(events[-1])
    assert set(last) == {"error"} and last["error"]["code"] == "provider_error", events[-1]
    return "error_event"


def check(response: httpx.Response, streamed: bool) -> str:
    assert response.status_code != 500, response.text
    if response.status_code == 200 and streamed:
        return check_stream(response.text)
    body = response.json()
    if response.status_code == 200:
        assert body["choices"][0]["message"]["content"].startswith("Hello from")
        return "completed"
    assert set(body) == {"error"} and {"message", "type", "code", "param"} <= set(body["error"])
    assert response.status_code in (429, 502, 504), response.text
    return f"error_{response.status_code}"


async def storm(base_url: str, midway: Callable[[], None] | None = None) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for number in range(REQUESTS):
        queue.put_nowait(number)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            number = queue.get_nowait()
            if midway is not None and number == REQUESTS // 2:
                await asyncio.to_thread(midway)
            streamed = number % 2 == 0
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "stream": streamed}
            try:
                response = await http.post(f"{base_url}/chat/completions", json=body)
            except httpx.TransportError as exc:  # counted, so the assertion shows how many
                kind = "stream" if streamed else "plain"
                outcomes[f"transport_{type(exc).__name__}_{kind}"] += 1
                continue
            outcomes[check(response, streamed)] += 1

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(CONCURRENCY)))
    return outcomes


@pytest.fixture
def chaotic_upstreams(upstream_factory: Callable[[str], FakeUpstream]) -> list[FakeUpstream]:
    upstreams = [upstream_factory(f"chaos{i}") for i in range(3)]
    for seed, up in enumerate(upstreams):
        up.set_mode(chaotic(seed))
    return upstreams


def test_random_failures_under_load_always_end_well_formed(
        start_gateway: Callable[..., GatewayProcess],
        chaotic_upstreams: list[FakeUpstream]) -> None:
    gateway = start_gateway(chaos_config(chaotic_upstreams))

    outcomes = asyncio.run(storm(gateway.base_url))

    assert sum(outcomes.values()) == REQUESTS
    assert not [o for o in outcomes if o.startswith("transport")], outcomes
    assert outcomes["completed"] > REQUESTS / 2, outcomes
    ready = httpx.get(f"{gateway.url}/ready").json()
    assert ready["inflight"] == 0, "a request was left counted in flight"
    assert "unhandled_error" not in gateway.logs()
    assert len(gateway.wait_for_log("request", REQUESTS)) == REQUESTS


def test_two_workers_sharing_redis_survive_redis_dying_midway(
        start_gateway: Callable[..., GatewayProcess], chaotic_upstreams: list[FakeUpstream],
        redis_server: RedisServer) -> None:
    doc = chaos_config(chaotic_upstreams,
                       state={"backend": "redis", "url": redis_server.url, "sync_interval": 0.2})
    gateway = start_gateway(doc, extra_args=("--workers", "2"))
    gateway.wait_for_log("shared_state_connected", count=2, timeout=10)

    outcomes = asyncio.run(storm(gateway.base_url, midway=redis_server.stop))

    assert sum(outcomes.values()) == REQUESTS
    assert not [o for o in outcomes if o.startswith("transport")], outcomes
    assert outcomes["completed"] > REQUESTS / 2, outcomes
    assert gateway.log_events("shared_state_unavailable"), "the outage was noticed and logged"
    assert "unhandled_error" not in gateway.logs()
