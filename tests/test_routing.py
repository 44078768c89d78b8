"""Beyond file order: spread by weight, prefer the fastest, per alias, shared through Redis."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.config.loader import parse
from gateway.core.settings import ConfigError, Route, RoutingPolicy
from gateway.routing.strategy import Latencies, Spread, ordered
from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, slow_first_token, status

HI = [{"role": "user", "content": "hi"}]


def served_by(gateway: GatewayProcess, model: str = "m", stream: bool = False) -> str:
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                        json={"model": model, "messages": HI, "stream": stream})
    assert answer.status_code == 200, answer.text
    return answer.headers["x-llms-provider"]


def test_weights_3_to_1_send_exactly_three_of_every_four_requests_to_the_heavier(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    big, small = upstream_factory("big"), upstream_factory("small")
    gateway = start_gateway(config({
        "big": provider(big.base_url, {"m": "m"}, weight=3),
        "small": provider(small.base_url, {"m": "m"}),
    }, models={"m": {"routing": {"strategy": "weighted"}}}))

    served = [served_by(gateway) for _ in range(8)]

    # Smooth weighted round robin is deterministic: checked exactly, not as a share of many.
    assert served == ["big", "big", "small", "big", "big", "big", "small", "big"]
    assert Counter(served) == {"big": 6, "small": 2}


def test_the_default_strategy_is_file_order_and_an_alias_may_override_it(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    gateway = start_gateway(config({
        "a": provider(a.base_url, {"ordered": "m", "spread": "m"}),
        "b": provider(b.base_url, {"ordered": "m", "spread": "m"}),
    }, models={"spread": {"routing": {"strategy": "weighted"}}}))

    assert {served_by(gateway, "ordered") for _ in range(10)} == {"a"}
    assert Counter(served_by(gateway, "spread") for _ in range(10)) == {"a": 5, "b": 5}


def test_a_weighted_first_choice_that_fails_still_fails_over(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    b.set_mode(status(503))
    gateway = start_gateway(config({
        "a": provider(a.base_url, {"m": "m"}), "b": provider(b.base_url, {"m": "m"}),
    }, defaults={"routing": {"strategy": "weighted"}, "circuit": {"enabled": False}}))

    answers = [httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": HI}) for _ in range(6)]

    assert all(a.status_code == 200 and a.headers["x-llms-provider"] == "a" for a in answers)
    assert sorted(a.headers["x-llms-attempts"] for a in answers) == ["1"] * 3 + ["2"] * 3


def test_latency_prefers_the_fast_provider_and_still_explores(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    slow, fast = upstream_factory("slow"), upstream_factory("fast")
    slow.set_mode(slow_first_token(0.6))
    gateway = start_gateway(config({
        "slow": provider(slow.base_url, {"m": "m"}), "fast": provider(fast.base_url, {"m": "m"}),
    }, defaults={"routing": {"strategy": "latency", "explore": 0.15}}))

    counts = Counter(served_by(gateway, stream=n % 2 == 0) for n in range(60))

    # Expected: the slow one once to be measured, then about 15% of the rest (about 9); the
    # bounds are several standard deviations wide, so chance does not fail the test.
    assert counts["fast"] >= 40, counts
    assert counts["slow"] >= 2, "exploration still tries the slow one now and then"


@pytest.mark.skipif(not RedisServer.available(), reason="redis-server is not installed")
def test_two_gateways_on_one_redis_share_what_latency_learned(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    slow, fast = upstream_factory("slow"), upstream_factory("fast")
    slow.set_mode(slow_first_token(0.3))
    redis = RedisServer().start()
    doc = config({"slow": provider(slow.base_url, {"m": "m"}),
                  "fast": provider(fast.base_url, {"m": "m"})},
                 defaults={"routing": {"strategy": "latency", "explore": 0}},
                 state={"backend": "redis", "url": redis.url, "sync_interval": 0.1})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = GatewayProcess(tmp_path / "one", doc).start()
    two = GatewayProcess(tmp_path / "two", doc).start()
    try:
        assert [served_by(one) for _ in range(3)] == ["slow", "fast", "fast"]
        redis.synced(one)  # what one measured is in Redis
        redis.synced(two)  # and two has read it
        slow.reset()
        assert {served_by(two) for _ in range(5)} == {"fast"}, "learned from the other"
        assert not slow.requests
    finally:
        one.stop()
        two.stop()
        redis.stop()


def test_smooth_weights_interleave_rather_than_burst() -> None:
    routes = (Route("a", "m", 3.0), Route("b", "m", 1.0))
    spread = Spread()
    firsts = [spread.first("x", routes).provider for _ in range(8)]
    assert firsts == ["a", "a", "b", "a", "a", "a", "b", "a"]


def test_an_unmeasured_candidate_goes_first_to_be_measured() -> None:
    routes = (Route("a", "m"), Route("b", "m"))
    latencies = Latencies()
    latencies.observe("a", "m", 0.1)
    policy = RoutingPolicy(strategy="latency", explore=0)
    assert ordered("x", routes, policy, Spread(), latencies)[0].provider == "b"
    latencies.observe("b", "m", 0.5)
    assert ordered("x", routes, policy, Spread(), latencies)[0].provider == "a"


def test_a_wrong_strategy_is_a_config_error_naming_the_alias(tmp_path: Path) -> None:
    doc = '{"providers": {}, "models": {"m": {"routing": {"strategy": "fastest"}}}}'
    with pytest.raises(ConfigError, match=r"models\.m\.routing"):
        parse(doc, tmp_path / "llms.json", {})


def test_what_a_reload_removes_is_forgotten_by_the_strategies() -> None:
    latencies, spread = Latencies(), Spread()
    latencies.observe("gone", "m", 0.1)
    spread.first("old-alias", (Route("gone", "m"),))
    latencies.retain([Route("kept", "m")])
    spread.retain(["new-alias"])
    assert latencies.averages == {} and spread.credits == {}



def test_a_slow_first_token_is_hedged_and_the_loser_s_request_closed(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    slow, quick = upstream_factory("slow"), upstream_factory("quick")
    slow.set_mode(slow_first_token(2.0))
    gateway = start_gateway(config({
        "slow": provider(slow.base_url, {"m": "m"}), "quick": provider(quick.base_url, {"m": "m"}),
    }, models={"m": {"routing": {"hedge_after": 0.3, "hedge_budget": 1}}}))

    for stream in (True, False):
        with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30, json={
                "model": "m", "messages": HI, "stream": stream}) as answer:
            body = answer.read()
        # Answered by the hedge (the quick one), so not after the slow one's 2 s.
        assert answer.headers["x-llms-provider"] == "quick", body
        assert answer.headers["x-llms-hedged"] == "1"
        assert b'"error"' not in body and b" quick" in body, "the winner's answer, whole"
        if stream:
            assert body.endswith(b"data: [DONE]\n\n")
        assert slow.wait_for_cancel(), "the slow one's upstream request was closed at once"
        slow.reset()
        slow.set_mode(slow_first_token(2.0))

    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'llms_hedges_total{model="m",result="started"} 2.0' in metrics
    assert 'llms_hedges_total{model="m",result="won"} 2.0' in metrics


def test_a_quick_first_token_is_not_hedged(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    first, second = upstream_factory("first"), upstream_factory("second")
    gateway = start_gateway(config({
        "first": provider(first.base_url, {"m": "m"}),
        "second": provider(second.base_url, {"m": "m"}),
    }, defaults={"routing": {"hedge_after": 1.0}}))

    answer = httpx.post(f"{gateway.base_url}/chat/completions",
                        json={"model": "m", "messages": HI})

    assert answer.headers["x-llms-provider"] == "first"
    assert "x-llms-hedged" not in answer.headers
    assert not second.requests


def test_a_hedge_whose_leader_fails_first_still_answers(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    broken, backup, third = (upstream_factory(n) for n in ("broken", "backup", "third"))
    broken.set_mode(slow_first_token(0.5, then=status(503)))
    backup.set_mode(slow_first_token(1.0))
    gateway = start_gateway(config({
        "broken": provider(broken.base_url, {"m": "m"}),
        "backup": provider(backup.base_url, {"m": "m"}),
        "third": provider(third.base_url, {"m": "m"}),
    }, defaults={"routing": {"hedge_after": 0.2, "hedge_budget": 1},
                 "circuit": {"enabled": False}}))

    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                        json={"model": "m", "messages": HI, "stream": True})

    assert answer.status_code == 200
    assert answer.headers["x-llms-provider"] == "backup"
    assert not third.requests, "never more than two in flight"
