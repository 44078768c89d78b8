"""Gateways sharing a Redis act as one: a provider one saw fail, the others skip."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, status
from tests.waiting import wait_until

MESSAGES = [{"role": "user", "content": "hello"}]


def shared_config(redis_url: str, flaky: FakeUpstream, backup: FakeUpstream) -> dict:
    return config({
        "flaky": provider(flaky.base_url, {"m": "m"}, circuit={"failures": 1, "open_for": 60}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }, state={"backend": "redis", "url": redis_url, "sync_interval": 0.2})


def chat(gateway: GatewayProcess) -> httpx.Response:
    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES})
    assert response.status_code == 200, response.text
    return response


def breaker_open(gateway: GatewayProcess, provider: str) -> bool:
    circuits = httpx.get(f"{gateway.url}/ready").json()["circuits"]
    return any(c["provider"] == provider and c["state"] == "open" for c in circuits)


def test_a_failure_seen_by_one_gateway_is_skipped_by_the_other_within_a_second(
        tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    flaky, backup = upstream_factory("flaky"), upstream_factory("backup")
    flaky.set_mode(status(503))
    doc = shared_config(redis_server.url, flaky, backup)
    first = GatewayProcess(tmp_path_factory.mktemp("a"), doc).start()
    second = GatewayProcess(tmp_path_factory.mktemp("b"), doc).start()
    try:
        assert chat(first).headers["x-llms-attempts"] == "2"
        wait_until(lambda: breaker_open(second, "flaky"), within=1.0,
                   what="the second gateway hearing that flaky's breaker opened")

        answer = chat(second)

        assert answer.headers["x-llms-provider"] == "backup"
        assert answer.headers["x-llms-attempts"] == "1", "the second gateway never tried flaky"
        assert len(flaky.requests) == 1
    finally:
        first.stop()
        second.stop()


def test_redis_going_away_never_fails_a_request_and_is_logged_once(
        start_gateway: Callable[..., GatewayProcess], redis_server: RedisServer,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    flaky, backup = upstream_factory("flaky"), upstream_factory("backup")
    gateway = start_gateway(shared_config(redis_server.url, flaky, backup))
    gateway.wait_for_log("shared_state_connected")

    redis_server.stop()
    for _ in range(10):  # requests keep coming through a second of failed syncs (every 0.2 s)
        chat(gateway)
        time.sleep(0.1)
    assert len(gateway.wait_for_log("shared_state_unavailable")) == 1

    redis_server.start()
    gateway.wait_for_log("shared_state_connected", count=2, timeout=5)
    chat(gateway)
