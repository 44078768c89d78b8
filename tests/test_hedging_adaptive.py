"""Hedging that learns its delay from the leading candidate's first tokens and budgets itself:
`routing.hedge_after: "p90"`, `routing.hedge_budget`.

The stories run through real sockets against fake upstreams whose delay sequence is fixed;
the quantile window and the budget are plain code, checked here with an injected clock."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.loader import parse
from gateway.core.settings import ConfigError, Route, quantile
from gateway.routing import router
from gateway.routing.health import ProviderHealth
from gateway.routing.hedging import (
    BUDGET_WINDOW,
    FALLBACK,
    FLOOR_WINDOW,
    MAX_AGE,
    MIN_SAMPLES,
    SAMPLES,
    AliasHedging,
    Budget,
    Hedging,
    Samples,
    interpolated,
)
from providers.contract.errors import ProviderRateLimited, ProviderUnavailable
from providers.contract.provider import Outgoing, Reply
from providers.contract.spec import CircuitPolicy, Retries
from tests.gateway_process import GatewayProcess, config, provider
from tests.test_status_page import CHROMIUM, chromium
from tests.upstream import FakeUpstream, Mode, ok, slow_first_token, status

HI = [{"role": "user", "content": "hi"}]
SLOW = 1.0  # the slow first token of the tail's one try in ten: far beyond a fast one


def ask(gateway: GatewayProcess) -> httpx.Response:
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                        json={"model": "m", "messages": HI})
    assert answer.status_code == 200, answer.text
    return answer


def hedging_of(gateway: GatewayProcess) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{gateway.url}/status.json").json()["hedging"]["m"]
    return found


# -- the stories, through real sockets ------------------------------------------------------


def test_p90_learns_a_delay_between_fast_and_slow_and_hedges_the_slow_ones(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    tail, backup = upstream_factory("tail"), upstream_factory("backup")
    # Nine quick first tokens, then one slow, over and over: the tail's k-th request gets the
    # k-th mode, and requests go one at a time, so the slow ones are every tenth.
    tail.set_mode(*([ok()] * 9 + [slow_first_token(SLOW)]) * 6)
    gateway = start_gateway(config({
        "tail": provider(tail.base_url, {"m": "m"}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }, models={"m": {"routing": {"hedge_after": "p90", "hedge_budget": 0.5}}}))

    for _ in range(MIN_SAMPLES):  # the fallback's turn, while the tail's window fills
        ask(gateway)
    learned = hedging_of(gateway)["delays"]
    measured = [ask(gateway) for _ in range(30)]

    tail_row = next(row for row in learned if row["provider"] == "tail")
    assert tail_row["learned"] and tail_row["samples"] == MIN_SAMPLES
    assert 0 < tail_row["delay_s"] < SLOW, "the p90 lies between the quick and the slow"
    slow = [a for i, a in enumerate(measured) if i % 10 == 9]
    assert all(a.headers.get("x-llms-hedged") == "1" for a in slow)
    assert all(a.headers["x-llms-provider"] == "backup" for a in slow)
    hedged = sum(a.headers.get("x-llms-hedged") == "1" for a in measured)
    # Every slow one, and not the quick ones: a quick one is hedged only when it happened to
    # be slower than the window's p90 (a busy machine), so the bound leaves room for a few.
    assert len(slow) <= hedged <= 10, hedged
    view = hedging_of(gateway)
    assert view["hedge_after"] == "p90" and view["requests"] == MIN_SAMPLES + 30
    assert view["hedges"] >= hedged  # a quick one slower than the 2 s fallback: one more
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'llms_hedge_delay_seconds{model="m",provider="tail"}' in metrics
    assert 'llms_hedges_total{model="m",result="started"}' in metrics


def test_a_quiet_alias_hedges_its_slow_first_requests_within_its_floor(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    slow, backup = upstream_factory("slow"), upstream_factory("backup")
    slow.set_mode(slow_first_token(2.0))
    # The default budget (0.05) would allow its first hedge at the alias's 20th request.
    gateway = start_gateway(config({
        "slow": provider(slow.base_url, {"m": "m"}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }, models={"m": {"routing": {"hedge_after": 0.3}}}))

    answers = [ask(gateway) for _ in range(4)]

    # The floor's three a minute: the first three are hedged and answered by the backup; the
    # fourth, past the floor and within no budget yet, waits on its first candidate.
    assert [a.headers.get("x-llms-hedged") for a in answers] == ["1", "1", "1", None]
    assert [a.headers["x-llms-provider"] for a in answers] == ["backup"] * 3 + ["slow"]
    view = hedging_of(gateway)
    assert (view["hedge_budget"], view["hedge_min"]) == (0.05, 3)
    assert (view["hedges"], view["last_minute"], view["over_budget"]) == (3, 3, 1)


def test_with_every_provider_slow_hedges_stop_at_the_budget(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    one, two = upstream_factory("one"), upstream_factory("two")
    for upstream in (one, two):
        upstream.set_mode(slow_first_token(0.2))  # always past the 0.02 s hedge_after
    gateway = start_gateway(config({
        "one": provider(one.base_url, {"m": "m"}),
        "two": provider(two.base_url, {"m": "m"}),
    }, models={"m": {"routing": {"hedge_after": 0.02, "hedge_budget": 0.1,
                                 "hedge_min": 0}}}))  # the budget alone, no floor below it

    answers = [ask(gateway) for _ in range(20)]

    # One hedge per ten requests, at the request that makes it fit: the 10th and the 20th.
    hedged = [i for i, a in enumerate(answers) if a.headers.get("x-llms-hedged") == "1"]
    assert hedged == [9, 19]
    assert len(two.requests) == 2, "the others waited on their first candidate"
    view = hedging_of(gateway)
    assert (view["requests"], view["hedges"], view["over_budget"]) == (20, 2, 18)
    assert view["budget_used"] == 0.1
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'llms_hedge_budget_used_ratio{model="m"} 0.1' in metrics
    assert 'llms_hedges_over_budget_total{model="m"} 18.0' in metrics
    assert 'llms_hedge_delay_seconds{model="m",provider="one"} 0.02' in metrics


@pytest.mark.parametrize("failure", [status(503), status(429, retry_after=60)],
                         ids=["open circuit", "cooling down"])
def test_a_candidate_with_an_open_circuit_or_cooling_down_is_never_hedged_into(
        failure: Mode, start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    first, excluded = upstream_factory("first"), upstream_factory("excluded")
    first.set_mode(status(503), slow_first_token(0.3))
    excluded.set_mode(failure)
    gateway = start_gateway(config({
        "first": provider(first.base_url, {"m": "m"}, circuit={"enabled": False}),
        "excluded": provider(excluded.base_url, {"m": "m"},
                             circuit={"failures": 1, "open_for": 60}),
    }, models={"m": {"routing": {"hedge_after": 0.02, "hedge_budget": 1}}}))
    failed = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                        json={"model": "m", "messages": HI})
    assert failed.status_code != 200  # both failed: `excluded` is now open, or cooling down

    answer = ask(gateway)

    assert answer.headers["x-llms-provider"] == "first"
    assert "x-llms-hedged" not in answer.headers
    assert len(excluded.requests) == 1


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_the_status_page_shows_each_alias_s_delay_and_budget(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})},
                                   models={"m": {"routing": {"hedge_after": "p90"}}}))
    ask(gateway)

    page = chromium(f"{gateway.url}/", tmp_path, "--dump-dom")

    assert 'data-loaded="true"' in page.stdout, page.stderr[-2000:]
    # Still learning (one sample): the fallback; nothing hedged of the 5 % allowed.
    assert f"m after {FALLBACK:g} s, budget 0% of 5%" in page.stdout
    assert ":CONSOLE(" not in page.stderr, "the page logged to the console (an error?)"


# -- the router: a candidate excluded while its leader runs ---------------------------------


class Leader:
    """A provider (the contract's duck type) slower than the hedge delay, which, once asked,
    puts the next candidate's provider in a cooldown (another request's 429, say)."""

    def __init__(self, name: str, act: Callable[[], None]) -> None:
        self.name = name
        self.act = act
        self.spec = type("Spec", (), {"retries": Retries(attempts=1),
                                      "circuit": CircuitPolicy()})()
        self.calls = 0

    async def answer(self, request: Outgoing, model: str) -> Reply:
        self.calls += 1
        self.act()
        await asyncio.sleep(0.2)  # slow: the race's 0.01 s timer comes first
        return Reply(self.name.encode())


def test_a_candidate_that_starts_cooling_down_during_the_wait_is_not_hedged_into() -> None:
    health = ProviderHealth()
    second = Leader("second", lambda: None)
    first = Leader("first", lambda: health.failed(
        Route("second", "m"), CircuitPolicy(), ProviderRateLimited("429", retry_after=60)))
    hedging = AliasHedging(0.01, 1.0)
    request = Outgoing("chat/completions", b"{}", "m", False, "r")

    served = asyncio.run(router.attempt(
        "m", (Route("first", "m"), Route("second", "m")), {"first": first, "second": second},
        request, router.Routing(health, None, hedging)))  # type: ignore[dict-item]

    assert served.provider == "first" and not served.hedged
    assert second.calls == 0
    assert hedging.budget.totals() == (1, 0), "no hedge started, none spent"


def test_a_leader_that_lost_the_race_is_kept_as_slow_as_it_had_been() -> None:
    slow = Leader("slow", lambda: None)  # answers after 0.2 s
    quick = Quick("quick")
    hedging = AliasHedging(0.01, 1.0)
    request = Outgoing("chat/completions", b"{}", "m", False, "r")

    served = asyncio.run(router.attempt(
        "m", (Route("slow", "m"), Route("quick", "m")), {"slow": slow, "quick": quick},
        request, router.Routing(None, None, hedging)))  # type: ignore[dict-item]

    assert served.provider == "quick" and served.hedged and served.hedge_won
    # Dropped, the slow tries would vanish from the window and pull the quantile down.
    rows = {row["provider"]: row for row in hedging.view()["delays"]}
    assert rows["slow"]["samples"] == 1 and rows["quick"]["samples"] == 1


def test_a_leader_left_unhedged_by_the_budget_still_fails_over_to_the_next() -> None:
    failing = Failing("failing")
    quick = Quick("quick")
    hedging = AliasHedging(0.01, 0.0)  # no budget at all
    request = Outgoing("chat/completions", b"{}", "m", False, "r")

    served = asyncio.run(router.attempt(
        "m", (Route("failing", "m"), Route("quick", "m")), {"failing": failing, "quick": quick},
        request, router.Routing(None, None, hedging)))  # type: ignore[dict-item]

    assert served.provider == "quick" and not served.hedged
    assert [a.provider for a in served.failed] == ["failing"]
    assert hedging.budget.refused == 1, "asked once, when the delay had passed"


class Failing(Leader):
    """A provider that fails slower than the hedge delay (a 503 after a while)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, lambda: None)

    async def answer(self, request: Outgoing, model: str) -> Reply:
        self.calls += 1
        await asyncio.sleep(0.2)  # the race's 0.01 s timer comes first
        raise ProviderUnavailable("503 after a while")


class Quick(Leader):
    """A provider that answers at once."""

    def __init__(self, name: str) -> None:
        super().__init__(name, lambda: None)

    async def answer(self, request: Outgoing, model: str) -> Reply:
        self.calls += 1
        return Reply(self.name.encode())


# -- the quantile window and the budget, with an injected clock ----------------------------


def test_a_quantile_is_read_in_the_form_dashboards_write_it() -> None:
    assert quantile("p50") == 0.5
    assert quantile("p90") == 0.9
    assert quantile("p99.9") == pytest.approx(0.999)
    for bad in ("p49", "p100", "p99.95", "90", "P90", "p", "p9o", "fast"):
        with pytest.raises(ValueError, match=r"\"p50\" to \"p99\.9\""):
            quantile(bad)


def test_a_quantile_is_interpolated_between_the_nearest_two_samples() -> None:
    assert interpolated([float(x) for x in range(10)], 0.9) == pytest.approx(8.1)
    assert interpolated([0.05] * 9 + [0.75], 0.9) == pytest.approx(0.05 + 0.1 * 0.7)
    assert interpolated([1.0], 0.99) == 1.0


def test_the_delay_is_the_fallback_until_enough_samples_then_the_learned_quantile() -> None:
    now = [0.0]
    hedging = AliasHedging("p90", 0.05, clock=lambda: now[0])
    samples = ([0.05] * 9 + [0.75]) * (MIN_SAMPLES // 10)
    for seconds in samples[:-1]:
        hedging.observe("tail", seconds)
    assert hedging.delay("tail") == FALLBACK
    hedging.observe("tail", samples[-1])

    assert 0.05 < hedging.delay("tail") < 0.75
    assert hedging.delay("never-seen") == FALLBACK
    now[0] += MAX_AGE + 1  # what it learned is too old to say how the provider is now
    assert hedging.delay("tail") == FALLBACK


def test_the_window_holds_the_latest_samples_only() -> None:
    hedging = AliasHedging("p50", 1.0, clock=lambda: 0.0)
    for seconds in [3.0] * SAMPLES + [0.1] * SAMPLES:
        hedging.observe("p", seconds)

    assert hedging.delay("p") == 0.1
    assert hedging.view()["delays"] == [{"provider": "p", "delay_s": 0.1, "samples": SAMPLES,
                                         "learned": True}]


def test_the_window_s_quantile_is_that_of_its_samples_as_they_come_and_go() -> None:
    now = [0.0]
    samples = Samples(clock=lambda: now[0])
    draws = random.Random(7)
    kept: list[tuple[float, float]] = []
    for number in range(2000):
        # Quick traffic first (the window's size binds), then slow (its age binds).
        now[0] += draws.random() * (1 if number < 1000 else 20)
        seconds = round(draws.random() * 3, 2)  # repeats, as real timings have
        samples.add(seconds)
        kept = [(at, s) for at, s in [*kept, (now[0], seconds)][-SAMPLES:]
                if at >= now[0] - MAX_AGE]
        expected = interpolated(sorted(s for _, s in kept), 0.9) \
            if len(kept) >= MIN_SAMPLES else None
        assert samples.quantile(0.9) == expected


def test_a_fixed_delay_stays_fixed() -> None:
    hedging = AliasHedging(0.3, 0.05)
    for _ in range(MIN_SAMPLES):
        hedging.observe("p", 5.0)
    assert hedging.delay("p") == 0.3


def test_the_budget_allows_its_share_of_requests_and_no_more() -> None:
    budget = Budget(0.05)
    allowed = []
    for number in range(1, 101):
        budget.requested()
        if budget.spend():  # every request wants a hedge: everything is slow
            allowed.append(number)

    assert allowed == [20, 40, 60, 80, 100]
    assert budget.refused == 95 and budget.used() == 0.05
    assert Budget(0.0).spend() is False


def test_the_floor_allows_its_hedges_per_minute_whatever_the_share() -> None:
    now = [1000.0]
    budget = Budget(0.05, floor=3, clock=lambda: now[0])
    budget.requested()
    assert [budget.spend() for _ in range(4)] == [True, True, True, False]
    now[0] += FLOOR_WINDOW - 1  # the first three are still within the minute
    assert not budget.spend()
    now[0] += 1  # a minute after them: three more
    assert [budget.spend() for _ in range(4)] == [True, True, True, False]
    assert budget.totals() == (1, 6) and budget.refused == 3
    # Once the alias has traffic, the share allows hedges beyond the floor's.
    for _ in range(200):
        budget.requested()
    assert [budget.spend() for _ in range(5)] == [True, True, True, True, False]
    assert Budget(0.0, floor=0).spend() is False


def test_the_budget_window_forgets_the_oldest_requests_a_bucket_at_a_time() -> None:
    budget = Budget(0.01)
    bucket = BUDGET_WINDOW // 10
    for _ in range(bucket):
        budget.requested()
    assert budget.spend() and not budget.spend()  # 1 of 100
    for _ in range(BUDGET_WINDOW - bucket):
        budget.requested()
    assert sum(budget.spend() for _ in range(20)) == 9  # 10 of 1,000
    for _ in range(bucket):  # a new bucket starts: the first one, with its hedge, is dropped
        budget.requested()

    assert budget.totals() == (BUDGET_WINDOW, 9)
    assert budget.spend() and not budget.spend()


def test_a_reload_keeps_what_was_learned_and_forgets_what_is_no_longer_routed() -> None:
    hedging = Hedging(clock=lambda: 0.0)
    alias = hedging.of("m", "p90", 0.05)
    assert alias is not None and hedging.of("other", None, 0.05) is None
    for _ in range(MIN_SAMPLES):
        alias.observe("a", 0.5)
        alias.observe("b", 0.5)

    again = hedging.of("m", "p95", 0.2)
    assert again is alias and alias.delay("a") == 0.5 and alias.budget.share == 0.2
    assert hedging.of("m", "p95", 0.2, 7) is alias and alias.budget.floor == 7
    hedging.retain([("m", "a"), ("kept-but-not-hedging", "a")])
    assert [row["provider"] for row in hedging.view()["m"]["delays"]] == ["a"]
    assert hedging.of("m", None, 0.05) is None and hedging.view() == {}


# -- config -----------------------------------------------------------------------------------


def parsed(routing: dict[str, Any], where: str = "models") -> Any:
    doc: dict[str, Any] = {"providers": {"p": {"type": "openai", "base_url": "http://x/v1",
                                                "models": {"m": "m"}}}}
    if where == "models":
        doc["models"] = {"m": {"routing": routing}}
    else:
        doc["defaults"] = {"routing": routing}
    return parse(json.dumps(doc), Path("llms.json"), {})


def test_hedge_after_takes_seconds_or_a_quantile_and_hedge_budget_a_share() -> None:
    assert parsed({"hedge_after": "p95"}).policy("m").routing.hedge_after == "p95"
    assert parsed({"hedge_after": 1}).policy("m").routing.hedge_after == 1.0
    routing = parsed({"hedge_after": 0.5, "hedge_budget": 0.2}).policy("m").routing
    assert routing.hedge_budget == 0.2
    assert parsed({}).policy("m").routing.hedge_budget == 0.05
    assert parsed({}).policy("m").routing.hedge_min == 3
    assert parsed({"hedge_min": 0}, "defaults").policy("m").routing.hedge_min == 0


@pytest.mark.parametrize(("routing", "where", "message"), [
    ({"hedge_after": "p100"}, "models", "models.m.routing.hedge_after: must be seconds"),
    ({"hedge_after": "fast"}, "defaults", "defaults.routing.hedge_after: must be seconds"),
    ({"hedge_after": 0}, "models", "models.m.routing.hedge_after"),
    ({"hedge_budget": 1.5}, "models", "models.m.routing.hedge_budget"),
    ({"hedge_budget": -0.1}, "defaults", "defaults.routing.hedge_budget"),
    ({"hedge_min": -1}, "models", "models.m.routing.hedge_min"),
    ({"hedge_min": 1.5}, "defaults", "defaults.routing.hedge_min"),
    ({"hedge_min": "3/min"}, "models", "models.m.routing.hedge_min"),
])
def test_a_bad_hedge_after_or_budget_is_a_config_error_naming_the_field(
        routing: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parsed(routing, where)
