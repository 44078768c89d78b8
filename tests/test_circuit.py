"""A provider that keeps failing goes last for a while instead of slowing every request."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from gateway.core.settings import Route
from gateway.routing.circuit import Breaker, CircuitState
from gateway.routing.health import Change, ProviderHealth
from providers.contract.errors import ProviderRateLimited, ProviderUnavailable
from providers.contract.spec import CircuitPolicy
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, ok, status

MESSAGES = [{"role": "user", "content": "hello"}]
POLICY = CircuitPolicy(failures=3, error_rate=0.5, window=60, min_requests=4, open_for=10,
                       max_open_for=35)


def test_breaker_opens_after_consecutive_failures_and_probes_once_half_open() -> None:
    breaker = Breaker(POLICY)
    assert not breaker.failure(0) and not breaker.failure(1)
    assert breaker.failure(2) and breaker.state is CircuitState.OPEN
    assert breaker.blocked_until(5) == 12 and not breaker.acquire(5)

    assert breaker.acquire(12) and breaker.state is CircuitState.HALF_OPEN
    assert not breaker.acquire(12.5), "only one probe at a time"
    assert breaker.failure(13), "a failed probe reopens at once"
    assert breaker.open_until == 13 + 20, "each trip doubles the open period"
    breaker.trip(40)
    assert breaker.open_until == 40 + 35, "capped at max_open_for"

    assert breaker.acquire(80)
    breaker.success(80)
    assert breaker.state is CircuitState.CLOSED and breaker.trips == 0


def test_breaker_opens_on_error_rate_over_the_window() -> None:
    breaker = Breaker(POLICY)
    for now, ok_ in enumerate([True, False, True, False]):
        breaker.success(now) if ok_ else breaker.failure(now)
    assert breaker.state is CircuitState.OPEN, "2 of 4 failed: 50% reaches the error rate"

    old = Breaker(POLICY)
    for now in (0, 1):
        old.failure(now)
        old.success(now)
    old.success(100)
    old.failure(101)
    assert old.state is CircuitState.CLOSED, "failures older than the window are forgotten"


def test_the_error_rate_window_stays_small_whatever_the_request_rate() -> None:
    breaker = Breaker(POLICY)
    for i in range(120_000):  # 2,000 answers a second for a minute
        breaker.success(i / 2_000)
    assert len(breaker._window) <= 61, "the window holds counts per slot, not every outcome"
    for i in range(3):
        breaker.failure(60 + i / 1000)
    assert breaker.state is CircuitState.OPEN, "3 consecutive failures still trip it"


def test_plan_puts_open_and_cooling_routes_last_the_soonest_to_recover_first() -> None:
    now = [100.0]
    health = ProviderHealth(clock=lambda: now[0])
    a, b, c = Route("a", "m"), Route("b", "m"), Route("c", "m")
    for _ in range(3):
        health.failed(a, POLICY, ProviderUnavailable("down", upstream_status=503))
    health.failed(b, POLICY, ProviderRateLimited("slow down", retry_after=4))

    plan = health.plan([a, b, c], lambda _: POLICY)
    assert [(p.route, p.forced) for p in plan] == [(c, False), (b, True), (a, True)], \
        "b cools down (4 s) before a's circuit half-opens (10 s)"

    now[0] = 105
    assert [(p.route, p.forced) for p in health.plan([a, b, c], lambda _: POLICY)] == [
        (b, False), (c, False), (a, True)]


def test_trips_are_announced_and_remote_ones_applied() -> None:
    seen: list[Change] = []
    health = ProviderHealth(clock=lambda: 50.0)
    health.listeners.append(seen.append)
    for _ in range(3):
        health.failed(Route("a", "m"), POLICY, ProviderUnavailable("x"))
    assert seen == [Change("a", "m", 60.0, 1)]

    other = ProviderHealth(clock=lambda: 51.0)
    other.apply_remote(seen[0], POLICY)
    other.apply_remote(Change("b", None, 70.0))
    assert [p.route.provider for p in other.plan([Route("a", "m"), Route("b", "m"),
                                                  Route("c", "m")], lambda _: POLICY)] == [
        "c", "a", "b"], "a opens until 60, b cools until 70: both after c"


def chat(gateway: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions",
                      json={"model": "m", "messages": MESSAGES})


def test_a_failing_provider_is_skipped_then_probed_and_trusted_again(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    flaky, backup = upstream_factory("flaky"), upstream_factory("backup")
    flaky.set_mode(status(503))
    gateway = start_gateway(config({
        "flaky": provider(flaky.base_url, {"m": "m"},
                          circuit={"failures": 2, "open_for": 0.5, "min_requests": 100}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }))

    assert [chat(gateway).headers["x-llms-attempts"] for _ in range(2)] == ["2", "2"]
    skipped = chat(gateway)
    assert skipped.headers["x-llms-provider"] == "backup"
    assert skipped.headers["x-llms-attempts"] == "1", "the open circuit costs no time"
    assert len(flaky.requests) == 2

    flaky.set_mode(ok())
    time.sleep(0.6)
    probe = chat(gateway)
    assert probe.headers["x-llms-provider"] == "flaky", "half-open lets a probe through"
    assert chat(gateway).headers["x-llms-provider"] == "flaky"


def test_429_cools_the_provider_down_for_its_retry_after(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    limited, backup = upstream_factory("limited"), upstream_factory("backup")
    limited.set_mode(status(429, retry_after=1), ok())
    gateway = start_gateway(config({
        "limited": provider(limited.base_url, {"m": "m"}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }))

    assert chat(gateway).headers["x-llms-provider"] == "backup"
    assert chat(gateway).headers["x-llms-attempts"] == "1"
    assert len(limited.requests) == 1, "cooling down: not asked again"
    time.sleep(1.1)
    assert chat(gateway).headers["x-llms-provider"] == "limited"


def test_when_every_candidate_is_open_the_soonest_is_still_tried(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    only = upstream_factory("only")
    only.set_mode(status(503), ok())
    gateway = start_gateway(config({
        "only": provider(only.base_url, {"m": "m"}, circuit={"failures": 1, "open_for": 60}),
    }))

    assert chat(gateway).status_code == 502
    recovered = chat(gateway)
    assert recovered.status_code == 200, "an open circuit never fails a request untried"
    assert len(only.requests) == 2
