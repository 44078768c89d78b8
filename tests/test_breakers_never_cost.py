"""Breakers never cost an answer: a request skips an open or cooling provider only while another
candidate may answer; once those have failed, the skipped ones are tried before it fails.

Under flapping upstreams, a gateway with breakers on answers every request one with
`circuit.enabled: false` answers (same upstreams, same requests), and still spends fewer tries
on the providers that are down.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import httpx
import pytest

from gateway.core.errors import AllProvidersFailed
from gateway.core.settings import Route
from gateway.routing import router
from gateway.routing.circuit import CircuitState
from gateway.routing.health import Planned, ProviderHealth
from providers.contract.errors import (
    BadUpstreamResponse,
    FirstTokenTimeout,
    ProviderError,
    ProviderRateLimited,
    ProviderUnavailable,
)
from providers.contract.provider import Outgoing, Reply
from providers.contract.spec import CircuitPolicy, Retries
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, Mode, hang, invalid_json, ok, status, stream_cut

POLICY = CircuitPolicy(failures=2, error_rate=0.5, window=60, min_requests=4, open_for=1,
                       max_open_for=10, rate_limit_cooldown=1)
OFF = CircuitPolicy(enabled=False)
A, B, C = Route("a", "m"), Route("b", "m"), Route("c", "m")


def down(health: ProviderHealth, route: Route) -> None:
    for _ in range(POLICY.failures):
        health.failed(route, POLICY, ProviderUnavailable("down", upstream_status=503))


def cool(health: ProviderHealth, route: Route, seconds: float) -> None:
    health.failed(route, POLICY, ProviderRateLimited("slow down", retry_after=seconds))


def test_every_candidate_excluded_all_are_tried_the_soonest_to_recover_first() -> None:
    health = ProviderHealth(clock=lambda: 100.0)
    down(health, A)  # open until 101
    cool(health, B, 30)  # until 130
    cool(health, C, 0.5)  # until 100.5

    plan = health.plan([A, B, C], lambda _: POLICY)

    assert plan == [Planned(C, True), Planned(A, True), Planned(B, True)]


def test_excluded_candidates_are_tried_after_the_ready_ones_soonest_first() -> None:
    health = ProviderHealth(clock=lambda: 100.0)
    down(health, A)  # open until 101
    cool(health, C, 0.5)  # until 100.5

    plan = health.plan([A, B, C], lambda _: POLICY)

    assert plan == [Planned(B), Planned(C, True), Planned(A, True)]


class Scripted:
    """A provider (the contract's duck type) answering from `outcome(clock())`, so two gateways
    run on one script see the same upstream whatever they asked of it before."""

    def __init__(self, name: str, outcome: Callable[[float], ProviderError | None],
                 clock: Callable[[], float], circuit: CircuitPolicy) -> None:
        self.name = name
        self.outcome = outcome
        self.clock = clock
        self.spec = type("Spec", (), {"retries": Retries(attempts=1), "circuit": circuit})()
        self.calls = 0

    async def answer(self, request: Outgoing, model: str) -> Reply:
        self.calls += 1
        error = self.outcome(self.clock())
        if error is not None:
            raise error
        return Reply(f"{self.name}:{model}".encode())


def ask(health: ProviderHealth, providers: dict[str, Scripted]) -> str | None:
    """One request through the router; who answered, None if it failed."""
    routes = tuple(Route(name, "m") for name in providers)
    request = Outgoing("chat/completions", b"{}", "m", False, "r")
    try:
        served = asyncio.run(router.attempt("m", routes, providers,  # type: ignore[arg-type]
                                            request, router.Routing(health)))
    except AllProvidersFailed:
        return None
    return served.provider


def always(error: ProviderError | None) -> Callable[[float], ProviderError | None]:
    return lambda _now: error


@pytest.mark.parametrize("excluded", ["half-open probe", "open, tried forced",
                                      "cooling down, tried forced"])
def test_an_excluded_provider_that_answers_is_trusted_again_at_once(excluded: str) -> None:
    now = [100.0]
    health = ProviderHealth(clock=lambda: now[0])
    providers = {
        "a": Scripted("a", always(None), lambda: now[0], POLICY),
        "b": Scripted("b", always(ProviderUnavailable("down", upstream_status=503)),
                      lambda: now[0], OFF),
    }
    if excluded == "cooling down, tried forced":
        cool(health, A, 30)
    else:
        down(health, A)
    if excluded == "half-open probe":
        now[0] += POLICY.open_for

    assert ask(health, providers) == "a", "b failed, so a was tried before failing"
    assert health.breaker(A, POLICY).state is CircuitState.CLOSED
    assert health.plan([A, Route("b", "m")], lambda _: POLICY)[0] == Planned(A), \
        "a goes first again at once, not after its open period or cooldown"


MODES = ("healthy", "5xx", "429", "hang", "cut", "garbage")
FAILURES: dict[str, ProviderError | None] = {
    "healthy": None,
    "5xx": ProviderUnavailable("bad gateway", upstream_status=502),
    "429": ProviderRateLimited("slow down", upstream_status=429),
    "hang": FirstTokenTimeout("no first token"),
    "cut": ProviderUnavailable("connection reset by peer"),
    "garbage": BadUpstreamResponse("not JSON"),
}
FLIP = 0.3  # seconds between mode switches
STEPS, PER_STEP = 400, 3


def flapping(seed: int) -> Callable[[float], ProviderError | None]:
    """A provider switching every FLIP seconds of the clock among MODES, repeatably."""
    modes = [random.Random(seed * 1000 + step).choice(MODES) for step in range(STEPS)]
    return lambda now: FAILURES[modes[min(int(now / FLIP), STEPS - 1)]]


def flapping_run(circuit: CircuitPolicy) -> tuple[list[str | None], int]:
    """Who answered each request of the script, and how many tries failed."""
    now = [0.0]
    health = ProviderHealth(clock=lambda: now[0])
    providers = {f"p{i}": Scripted(f"p{i}", flapping(i), lambda: now[0], circuit)
                 for i in range(3)}
    answered = []
    for _ in range(STEPS * PER_STEP):
        answered.append(ask(health, providers))
        now[0] += FLIP / PER_STEP
    tries = sum(p.calls for p in providers.values())
    return answered, tries - sum(a is not None for a in answered)


def test_under_flapping_upstreams_breakers_on_answer_every_request_breakers_off_do() -> None:
    on, failed_tries_on = flapping_run(POLICY)
    off, failed_tries_off = flapping_run(OFF)

    assert [a is not None for a in on] == [a is not None for a in off], \
        "the same requests answered, breakers on or off"
    assert off.count(None) > 0, "the script has moments when no provider answers"
    assert failed_tries_on < failed_tries_off, "and the breakers still save failing tries"


# End to end: two real gateways, breakers on and off, in front of the same three upstreams
# whose modes the test switches between steps. Breakers stay open and cooldowns last for the
# whole test (open_for and rate_limit_cooldown of a minute), so no outcome depends on timing.
STEP_MODES: list[tuple[Mode, Mode, Mode]] = [
    (ok(), ok(), ok()),
    (status(503), ok(), ok()),  # p0 opens (failures: 1)
    (ok(), status(429), status(502)),  # p1 cools down, p2 opens; only p0, open, answers
    (stream_cut(0), invalid_json(), ok()),  # all excluded: every one is tried, p2 answers
    (ok(), hang(), status(500)),  # p2 (closed at step 3) fails; p0, still open, answers
    (status(503), status(429), status(503)),  # nobody answers, on or off
    (invalid_json(), ok(), hang()),  # only p1, cooling down, answers
    (ok(), ok(), ok()),
]


def chat(gateway: GatewayProcess) -> int:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                      ).status_code


def test_breakers_on_answer_what_breakers_off_answer_through_flapping_upstreams(
        tmp_path_factory: pytest.TempPathFactory,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    ups = [upstream_factory(f"p{i}") for i in range(3)]

    def gateway_config(circuit: dict[str, object]) -> dict[str, object]:
        return config({up.name: provider(up.base_url, {"m": "m"}) for up in ups},
                      defaults={"circuit": circuit,
                                "timeouts": {"connect": 2, "first_token": 1, "idle": 1,
                                             "total": 5}})

    on = GatewayProcess(tmp_path_factory.mktemp("on"), gateway_config(
        {"failures": 1, "open_for": 60, "max_open_for": 60, "rate_limit_cooldown": 60})).start()
    off = GatewayProcess(tmp_path_factory.mktemp("off"),
                         gateway_config({"enabled": False})).start()
    try:
        answers: dict[str, list[int]] = {"on": [], "off": []}
        for modes in STEP_MODES:
            for up, mode in zip(ups, modes, strict=True):
                up.set_mode(mode)
            answers["on"].append(chat(on))
            answers["off"].append(chat(off))
    finally:
        on.stop()
        off.stop()

    assert answers["off"] == [200, 200, 200, 200, 200, 502, 200, 200]
    assert answers["on"] == answers["off"], "breakers on cost no answer"
