"""Each gateway key gets its own requests and tokens per minute, across replicas."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from gateway.core.limits import KeyLimits, RateLimiter
from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hello"}]


def away_from_a_minute_boundary() -> None:
    """Fixed windows reset on the minute: keep a test's requests inside one window."""
    left = 60 - time.time() % 60
    if left < 8:
        time.sleep(left + 0.2)


def test_limiter_counts_requests_and_tokens_per_window() -> None:
    now = [120.0]
    limiter = RateLimiter(clock=lambda: now[0])
    team = KeyLimits("team", requests_per_minute=2, tokens_per_minute=100)

    assert limiter.admit(team) is None and limiter.admit(team) is None
    assert limiter.admit(team) == 60, "refused until the window ends"
    now[0] = 180.5
    assert limiter.admit(team) is None
    limiter.spend_tokens("team", 150)
    assert limiter.admit(team) == pytest.approx(59.5), "tokens over the limit refuse too"


def test_limiter_adds_what_other_replicas_reported() -> None:
    limiter = RateLimiter(clock=lambda: 30.0)
    team = KeyLimits("team", requests_per_minute=5)
    assert limiter.admit(team) is None
    limiter.apply_totals({("team", 0, "req"): 5})

    assert limiter.admit(team) is not None


def chat(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions",
                      json={"model": "m", "messages": MESSAGES},
                      headers={"Authorization": f"Bearer {key}"})


def limited_config(up: FakeUpstream, **state: object) -> dict:
    return config(
        {"up": provider(up.base_url, {"m": "m"})},
        server={"api_keys": [
            {"key": "key-for-team-a", "id": "team-a", "requests_per_minute": 3},
            {"key": "key-for-team-b", "id": "team-b", "tokens_per_minute": 20},
            "unlimited-key"]},
        **({"state": state} if state else {}))


def test_a_key_over_its_limits_gets_429_while_others_carry_on(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(limited_config(up))
    away_from_a_minute_boundary()

    statuses = [chat(gateway, "key-for-team-a").status_code for _ in range(4)]
    refused = chat(gateway, "key-for-team-a")

    assert statuses == [200, 200, 200, 429]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "key-for-team-a" not in refused.text
    assert chat(gateway, "unlimited-key").status_code == 200
    # Each answer reports 7 tokens: after three (21) the budget of 20 is spent.
    assert [chat(gateway, "key-for-team-b").status_code for _ in range(4)] == [
        200, 200, 200, 429]
    logged = gateway.wait_for_log("request", 10)  # written once each answer is sent
    assert {r["key_id"] for r in logged} == {"team-a", "team-b", "key-" + __import__(
        "hashlib").sha256(b"unlimited-key").hexdigest()[:8]}
    assert "key-for-team" not in gateway.logs()


def test_limits_hold_across_replicas_sharing_redis(
        tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    doc = limited_config(up, backend="redis", url=redis_server.url, sync_interval=0.1)
    first = GatewayProcess(tmp_path_factory.mktemp("a"), doc).start()
    second = GatewayProcess(tmp_path_factory.mktemp("b"), doc).start()
    try:
        first.wait_for_log("shared_state_connected")
        second.wait_for_log("shared_state_connected")
        away_from_a_minute_boundary()
        assert [chat(first, "key-for-team-a").status_code for _ in range(2)] == [200, 200]
        time.sleep(0.5)

        assert chat(second, "key-for-team-a").status_code == 200
        time.sleep(0.5)
        assert chat(second, "key-for-team-a").status_code == 429
        assert chat(first, "key-for-team-a").status_code == 429
    finally:
        first.stop()
        second.stop()
