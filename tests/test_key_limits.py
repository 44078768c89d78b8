"""Each gateway key gets its own requests and tokens per minute, across replicas."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gateway.core.limits import KeyLimits, RateLimiter
from tests.gateway_process import GatewayProcess, config, provider
from tests.minutes import within_one_minute
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hello"}]


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


KEY = "unlimited-key"  # to read a gateway's /ready


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
        tmp_path_factory: pytest.TempPathFactory,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")

    def story() -> None:  # in one minute, on a gateway of its own: its counts start at zero
        gateway = GatewayProcess(tmp_path_factory.mktemp("limits"), limited_config(up)).start()
        try:
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
        finally:
            gateway.stop()

    within_one_minute(story)


def test_limits_hold_across_replicas_sharing_redis(
        tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    doc = limited_config(up, backend="redis", url=redis_server.url, sync_interval=0.1)

    def story() -> None:  # in one minute, on gateways and a Redis of its own
        redis_server.stop()
        redis_server.start()
        first = GatewayProcess(tmp_path_factory.mktemp("a"), doc).start()
        second = GatewayProcess(tmp_path_factory.mktemp("b"), doc).start()
        try:
            first.wait_for_log("shared_state_connected")
            second.wait_for_log("shared_state_connected")
            assert [chat(first, "key-for-team-a").status_code for _ in range(2)] == [200, 200]
            redis_server.synced(first, KEY)  # its two are counted in Redis

            assert chat(second, "key-for-team-a").status_code == 200
            redis_server.synced(second, KEY)  # its third is counted: it read 3 back
            redis_server.synced(first, KEY)  # and so has the first
            assert chat(second, "key-for-team-a").status_code == 429
            assert chat(first, "key-for-team-a").status_code == 429
        finally:
            first.stop()
            second.stop()

    within_one_minute(story)
