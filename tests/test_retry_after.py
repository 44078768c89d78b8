"""An upstream's Retry-After is a hint, believed up to `retries.max_retry_after` and no further."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from providers.wire.upstream_errors import retry_after_seconds
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, ok, status

MESSAGES = [{"role": "user", "content": "hello"}]


def _chat(gateway: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": "chat-model", "messages": MESSAGES})


def _cooling_for(gateway: GatewayProcess, name: str) -> float:
    """Seconds of `name`'s cooldown left, as /ready shows it (0: none)."""
    return max((row["open_for"] for row in gateway.circuits(name)
                if row["state"] == "cooling_down"), default=0.0)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-5", "1e999", "9" * 5000, "soon",
                                   "Wed, 21 Oct 99999 07:28:00 GMT", "1_000", "+5", "1e3",
                                   "\u0663", "0x10", ".", "1.5.3"])
def test_a_retry_after_that_is_no_wait_counts_as_absent(value: str) -> None:
    assert retry_after_seconds(value) is None


def test_a_retry_after_still_parses_seconds_and_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(" 2.5 ") == 2.5
    assert retry_after_seconds("Thu, 01 Jan 1970 00:01:40 GMT", now=90) == 10


@pytest.mark.parametrize("value", ["inf", "nan", "1e999"])
def test_a_429_saying_retry_after_infinity_is_a_failover_not_a_500(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], value: str) -> None:
    primary, secondary = upstream_factory("primary"), upstream_factory("secondary")
    primary.set_mode(status(429, retry_after=value))
    gateway = start_gateway(config({
        "primary": provider(primary.base_url, {"chat-model": "p"}),
        "secondary": provider(secondary.base_url, {"chat-model": "s"}),
    }))

    response = _chat(gateway)

    assert response.status_code == 200, response.text
    assert response.headers["x-llms-provider"] == "secondary"


def test_a_retry_after_in_2099_benches_the_provider_only_for_max_retry_after(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    primary, secondary = upstream_factory("primary"), upstream_factory("secondary")
    primary.set_mode(status(429, retry_after="Wed, 21 Oct 2099 07:28:00 GMT"), ok())
    gateway = start_gateway(config({
        "primary": provider(primary.base_url, {"chat-model": "p"}),
        "secondary": provider(secondary.base_url, {"chat-model": "s"}),
    }, defaults={"retries": {"max_retry_after": 1}}))

    first = _chat(gateway)
    benched = _chat(gateway)
    asked_while_benched = len(primary.requests)
    benched_for = _cooling_for(gateway, "primary")
    wait_until(lambda: not _cooling_for(gateway, "primary"), within=30,
               what="primary's cooldown over")
    recovered = _chat(gateway)

    assert 0 < benched_for <= 1, "benched for max_retry_after at most, not until 2099"
    assert first.headers["x-llms-provider"] == "secondary"
    assert benched.headers["x-llms-provider"] == "secondary"  # cooling down, not asked
    assert asked_while_benched == 1
    assert recovered.headers["x-llms-provider"] == "primary", recovered.text


def test_the_retry_after_relayed_to_a_client_is_bounded_too(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    only = upstream_factory("only")
    only.set_mode(status(429, retry_after="Wed, 21 Oct 2099 07:28:00 GMT"))
    doc: dict[str, Any] = config({"only": provider(only.base_url, {"chat-model": "o"})},
                                 defaults={"retries": {"max_retry_after": 7}})
    gateway = start_gateway(doc)

    response = _chat(gateway)

    assert response.status_code == 429, response.text
    assert response.headers["Retry-After"] == "7"


def test_a_2099_cooldown_shared_through_redis_benches_the_provider_only_for_max_retry_after(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], redis_server: Any) -> None:
    """A cooldown another gateway wrote to Redis (an older version believed the 2099 date) is
    believed no longer than this gateway's own bound, then forgotten, not reapplied each sync."""
    primary, secondary = upstream_factory("primary"), upstream_factory("secondary")
    client = redis.Redis.from_url(redis_server.url)
    client.hset("llms-gateway:health", "primary\x1f", "[4096000000.0, 0]")  # Oct 2099
    gateway = start_gateway(config({
        "primary": provider(primary.base_url, {"chat-model": "p"}),
        "secondary": provider(secondary.base_url, {"chat-model": "s"}),
    }, defaults={"retries": {"max_retry_after": 3}},
        state={"backend": "redis", "url": redis_server.url, "sync_interval": 0.1}))

    wait_until(lambda: _chat(gateway).headers["x-llms-provider"] == "secondary", within=10)
    benched_for = _cooling_for(gateway, "primary")
    # Reapplied at each sync, it would never end: this wait would fail.
    wait_until(lambda: not _cooling_for(gateway, "primary"), within=30,
               what="primary's cooldown over, not renewed from Redis")
    served_by = [_chat(gateway).headers["x-llms-provider"] for _ in range(3)]

    assert 0 < benched_for <= 3, "held for this gateway's max_retry_after, not until 2099"
    assert served_by == ["primary"] * 3
    assert not client.hexists("llms-gateway:health", "primary\x1f")
    client.close()
