"""A provider that keeps failing goes last for a while instead of slowing every request."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from gateway.core.settings import Route
from gateway.routing.circuit import Breaker, CircuitState
from gateway.routing.health import Change, Planned, ProviderHealth
from providers.contract.errors import ProviderRateLimited, ProviderUnavailable
from providers.contract.spec import CircuitPolicy
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, held, ok, paused, status, stream_cut

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


def excluded_no_more(gateway: GatewayProcess, name: str) -> bool:
    """/ready shows no breaker of `name` still open and no cooldown of it left: the next
    request may try it (a breaker past its open period half-opens for that request)."""
    return all(row["open_for"] == 0 for row in gateway.circuits(name))


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
    wait_until(lambda: excluded_no_more(gateway, "flaky"), within=30,
               what="flaky's circuit past its open period")
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
    wait_until(lambda: excluded_no_more(gateway, "limited"), within=30,
               what="limited's cooldown over")
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


def test_a_forced_try_s_429_never_frees_another_request_s_probe() -> None:
    now = [100.0]
    health = ProviderHealth(clock=lambda: now[0])
    a = Route("a", "m")
    for _ in range(POLICY.failures):
        health.failed(a, POLICY, ProviderUnavailable("down", upstream_status=503))
    now[0] = 111  # open_for (10 s) is over: half-open
    probe = health.acquire(Planned(a), POLICY)
    assert probe, "the first request after open_for is the probe"

    forced = health.acquire(Planned(a, forced=True), POLICY)  # every other candidate failed
    assert not forced, "the probe is out: the forced try goes without a claim"
    health.failed(a, POLICY, ProviderRateLimited("slow down", retry_after=1))
    now[0] = 112  # the 429's cooldown is over

    assert not health.acquire(Planned(a), POLICY), "the first probe is still out: no second"
    assert health.breakers[("a", "m")].state is CircuitState.HALF_OPEN


def test_a_probe_is_freed_by_its_own_request_only() -> None:
    breaker = Breaker(POLICY)
    for now in (0, 1, 2):
        breaker.failure(now)
    first = breaker.acquire(12)
    assert first, "half-open: the probe"
    breaker.success(12)  # another request (forced) answered: closed
    breaker.trip(20)  # and it failed again: open until 30
    second = breaker.acquire(31)
    assert second, "half-open again: a new probe"

    breaker.release(first)  # the first probe's request ends late, with no verdict
    assert not breaker.acquire(31.5), "the new probe is not the old one's to free"
    breaker.release(second)
    assert breaker.acquire(32), "its own request frees it"


def stream_lines(gateway: GatewayProcess) -> tuple[httpx.Response, list[str]]:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body,
                      timeout=30) as answer:
        return answer, [line for line in answer.iter_lines() if line]


def breaking_and_steady(start_gateway: Callable[..., GatewayProcess], breaking: FakeUpstream,
                        steady: FakeUpstream) -> GatewayProcess:
    return start_gateway(config({
        "breaking": provider(breaking.base_url, {"m": "m"},
                             circuit={"failures": 3, "open_for": 60, "min_requests": 100}),
        "steady": provider(steady.base_url, {"m": "m"}),
    }))


def test_streams_that_break_mid_answer_open_the_provider_s_circuit(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    breaking, steady = upstream_factory("breaking"), upstream_factory("steady")
    breaking.set_mode(stream_cut(after_chunks=2))  # its role chunk, two words, then a reset
    gateway = breaking_and_steady(start_gateway, breaking, steady)

    for _ in range(3):
        answer, lines = stream_lines(gateway)
        assert answer.headers["x-llms-provider"] == "breaking"
        assert "failed mid-stream" in lines[-1], "the client learns the stream broke"

    answer, lines = stream_lines(gateway)
    assert answer.headers["x-llms-provider"] == "steady"
    assert answer.headers["x-llms-attempts"] == "1", "the open circuit costs no time"
    assert lines[-1] == "data: [DONE]"
    assert len(breaking.requests) == 3, "three breaks opened its circuit: not asked again"


def test_a_client_leaving_mid_stream_is_no_failure_of_the_provider(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    breaking, steady = upstream_factory("breaking"), upstream_factory("steady")
    breaking.set_mode(paused(after_events=2))  # its role chunk, a word, then nothing yet
    gateway = breaking_and_steady(start_gateway, breaking, steady)
    body = {"model": "m", "messages": MESSAGES, "stream": True}

    for left in range(1, 4):
        with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body,
                          timeout=30) as answer:
            next(line for line in answer.iter_lines() if '"content": "Hello' in line)
        wait_until(lambda: breaking.cancelled == left)  # noqa: B023 - awaited here
    breaking.set_mode(ok())

    answer, _ = stream_lines(gateway)
    assert answer.headers["x-llms-provider"] == "breaking"


def test_a_forced_try_s_429_leaves_the_probe_out_through_the_gateway(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    a.set_mode(status(503), held(), status(429), ok())
    b.set_mode(ok(), status(503), ok())
    gateway = start_gateway(config({
        "a": provider(a.base_url, {"m": "m"}, circuit={
            "failures": 1, "open_for": 0.3, "max_open_for": 0.3, "rate_limit_cooldown": 0.05}),
        "b": provider(b.base_url, {"m": "m"}, circuit={"failures": 100}),
    }))
    assert chat(gateway).headers["x-llms-provider"] == "b", "a failed: its circuit opens"
    wait_until(lambda: excluded_no_more(gateway, "a"), within=30,
               what="a's circuit past its open period: it half-opens")

    with ThreadPoolExecutor(1) as pool:
        probe = pool.submit(chat, gateway)  # a's probe, held upstream
        wait_until(lambda: len(a.requests) == 2)
        forced = chat(gateway)  # b fails, then a is tried forced, and answers 429
        assert forced.status_code >= 400 and len(a.requests) == 3
        wait_until(lambda: excluded_no_more(gateway, "a"), within=30,
                   what="a's cooldown over (its breaker is half-open, the probe out)")

        after = chat(gateway)
        assert after.headers["x-llms-provider"] == "b", "a's probe is still out: b first"
        assert len(a.requests) == 3, "no second probe reached a"
        a.release()
        assert probe.result().headers["x-llms-provider"] == "a"


def test_streams_another_candidate_had_to_resume_count_against_the_one_that_broke(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    breaking, steady = upstream_factory("breaking"), upstream_factory("steady")
    breaking.set_mode(stream_cut(after_chunks=2))
    gateway = start_gateway(config({
        "breaking": provider(breaking.base_url, {"m": "m"},
                             circuit={"failures": 3, "open_for": 60, "min_requests": 100}),
        "steady": provider(steady.base_url, {"m": "m"}, circuit={"failures": 3}),
    }, models={"m": {"resume": True}}))

    for _ in range(3):
        answer, lines = stream_lines(gateway)
        assert answer.headers["x-llms-provider"] == "breaking"
        assert lines[-1] == "data: [DONE]", "steady finished what breaking began"

    answer, _ = stream_lines(gateway)
    assert answer.headers["x-llms-provider"] == "steady"
    assert len(breaking.requests) == 3 and len(steady.requests) == 4
    states = {c["provider"]: c["state"] for c in
              httpx.get(f"{gateway.url}/ready").json()["circuits"]}
    assert states == {"breaking": "open", "steady": "closed"}, "its continuations finished"
