"""Candidates sorted by price, latency or throughput, per alias or per request, and bounded by
`max_price` (issue 47, item 1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import pytest

from gateway.accounts.pricing import Need, priced
from gateway.core.record import Outcome, Record
from gateway.core.settings import MaxPrice, Route, RoutingPolicy
from gateway.observe.observers import measured_by
from gateway.routing import sorting
from gateway.routing.sorting import Throughputs
from gateway.routing.strategy import Latencies, Spread, ordered
from providers.contract.errors import InvalidRequest
from providers.contract.usage import Price, Usage
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, slow_first_token, status

HI = [{"role": "user", "content": "hi"}]
# Dollars per million tokens, prompt and completion: the cheapest is last in file order.
PRICES = {"dear": (5.0, 15.0), "mid": (1.0, 3.0), "cheap": (0.37, 1.13)}


def priced_model(name: str, prompt: float | None = None, completion: float | None = None
                 ) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": f"house-{name}-model"}
    if prompt is not None:
        entry["price"] = {"input": prompt, "output": completion}
    return {"m": entry}


def three(upstream_factory: Callable[[str], FakeUpstream]
          ) -> tuple[dict[str, FakeUpstream], dict[str, Any]]:
    """Three providers of `m` at different prices, dearest first in the file."""
    fakes = {name: upstream_factory(name) for name in PRICES}
    providers = {name: provider(fake.base_url, priced_model(name, *PRICES[name]))
                 for name, fake in fakes.items()}
    return fakes, providers


def post(gateway: GatewayProcess, body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, headers=headers,
                      json={"model": "m", "messages": HI, **(body or {})})


def served(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text
    return answer.headers["x-llms-provider"]


def test_price_serves_the_cheapest_and_fails_over_to_the_next_cheapest(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    fakes, providers = three(upstream_factory)
    gateway = start_gateway(config(providers, models={"m": {"routing": {"strategy": "price"}}},
                                   defaults={"circuit": {"enabled": False}}))

    assert {served(post(gateway)) for _ in range(3)} == {"cheap"}

    fakes["cheap"].set_mode(status(500))
    answer = post(gateway)
    assert served(answer) == "mid", "the next cheapest, not the file's first"
    assert answer.headers["x-llms-attempts"] == "2"
    assert not fakes["dear"].requests


def test_x_llms_sort_latency_picks_the_fastest_measured(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    slow, fast = upstream_factory("slow"), upstream_factory("fast")
    slow.set_mode(slow_first_token(0.4))
    gateway = start_gateway(config({"slow": provider(slow.base_url, {"m": "m"}),
                                    "fast": provider(fast.base_url, {"m": "m"})}))
    sort = {"x-llms-sort": "latency"}

    # Unmeasured first, each in turn, so both get measured.
    assert [served(post(gateway, headers=sort)) for _ in range(2)] == ["slow", "fast"]
    assert {served(post(gateway, headers=sort, body={"stream": n % 2 == 0}))
            for n in range(4)} == {"fast"}
    assert served(post(gateway)) == "slow", "a plain request keeps the file's order"


def test_openrouters_provider_sort_is_honoured_and_never_reaches_the_upstream(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    fakes, providers = three(upstream_factory)
    gateway = start_gateway(config(providers))

    assert served(post(gateway)) == "dear", "file order without a sort"
    answer = post(gateway, {"provider": {"sort": "price", "allow_fallbacks": True}})

    assert served(answer) == "cheap"
    forwarded = fakes["cheap"].last_json
    assert "provider" not in forwarded and forwarded["messages"] == HI
    assert "provider" not in fakes["dear"].last_json


@pytest.mark.parametrize(("body", "headers", "param"), [
    ({}, {"x-llms-sort": "fastest"}, "x-llms-sort"),
    ({"provider": {"sort": "cheapest"}}, {}, "provider.sort"),
    ({"provider": {"max_price": {"prompt": "cheap"}}}, {}, "provider.max_price"),
])
def test_a_bad_sort_or_price_bound_is_a_400_naming_its_param(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], body: dict[str, Any],
        headers: dict[str, str], param: str) -> None:
    fake = upstream_factory("a")
    gateway = start_gateway(config({"a": provider(fake.base_url, {"m": "m"})}))

    answer = post(gateway, body, headers)

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert not fake.requests


def test_max_price_excludes_dearer_candidates_and_names_the_cheapest_when_none_is_left(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    fakes, providers = three(upstream_factory)
    gateway = start_gateway(config(providers, models={"m": {"routing": {
        "max_price": {"prompt": 2, "completion": 5}}}}))

    assert served(post(gateway)) == "mid", "the dear one is over the alias's bound"

    answer = post(gateway, {"provider": {"max_price": {"prompt": 0.1, "completion": 0.5}}})

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "max_price" in error["param"]
    assert "$0.37/M prompt, $1.13/M completion" in error["message"]
    assert not fakes["dear"].requests


def test_an_unknown_price_sorts_last_is_never_within_max_price_and_is_named_in_status(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    mystery, known = upstream_factory("mystery"), upstream_factory("known")
    gateway = start_gateway(config({
        "mystery": provider(mystery.base_url, priced_model("mystery")),
        "known": provider(known.base_url, priced_model("known", 9.0, 30.0)),
    }, defaults={"circuit": {"enabled": False}}))
    by_price = {"x-llms-sort": "price"}

    assert served(post(gateway, headers=by_price)) == "known", "dearer, but its price is known"
    known.set_mode(status(500))
    assert served(post(gateway, headers=by_price)) == "mystery", "last, still tried"
    tried = len(mystery.requests)
    bounded = post(gateway, {"provider": {"max_price": {"prompt": 100, "completion": 100}}})
    assert bounded.status_code == 502, "the known one fails, and the unknown one is not within"
    assert len(mystery.requests) == tried

    unknown = httpx.get(f"{gateway.url}/status.json", timeout=5).json()["unknown_prices"]
    assert unknown == [{"alias": "m", "provider": "mystery", "model": "house-mystery-model"}]


# The rules themselves, without sockets.

A, B, C = Route("a", "ma"), Route("b", "mb"), Route("c", "mc")


def test_price_order_is_the_requests_cost_with_unknown_prices_last_in_file_order() -> None:
    costs = {A: None, B: 2.0, C: 1.0}
    assert sorting.by_price((A, B, C), costs.get) == (C, B, A)
    assert sorting.by_price((A, C), {A: None, C: None}.get) == (A, C)


def test_a_cache_breakpoint_prices_the_prompt_at_its_cached_input_price() -> None:
    need = Need(prompt=100_000, output=100)
    caching, plain = Price(3.0, 15.0, cached_input=0.3), Price(1.0, 5.0)
    assert priced("chat/completions", need, caching) > priced("chat/completions", need, plain)
    assert priced("chat/completions", need, caching, cached=True) \
        < priced("chat/completions", need, plain, cached=True)


def test_max_price_keeps_what_is_within_every_bound() -> None:
    prices = {A: Price(1.0, 2.0), B: Price(3.0, 1.0), C: None}
    assert sorting.within((A, B, C), (MaxPrice(prompt=2.0),), prices.get) == (A,)
    assert sorting.within((A, B, C), (MaxPrice(completion=1.5),), prices.get) == (B,)
    assert sorting.within((A, B, C), (MaxPrice(),), prices.get) == (A, B)
    assert sorting.usd(0.37) == "$0.37" and sorting.usd(3) == "$3.00" \
        and sorting.usd(0.075) == "$0.075"


def test_a_requested_sort_overrides_the_alias_strategy_and_latency_is_a_full_order() -> None:
    latencies = Latencies()
    for route, seconds in ((A, 0.9), (B, 0.1), (C, 0.5)):
        latencies.observe(route.provider, route.upstream_model, seconds)
    policy = RoutingPolicy(strategy="weighted")
    assert ordered("x", (A, B, C), policy, Spread(), latencies, sort="latency") == (B, C, A)
    # With no cost to price by, the price sort keeps file order.
    assert ordered("x", (A, B, C), RoutingPolicy(strategy="price"), Spread(), latencies) \
        == (A, B, C)


def test_throughput_is_a_streams_tokens_over_its_time_after_the_first_token() -> None:
    throughputs = Throughputs()
    routes = {"a": A, "b": B}
    listener = measured_by(throughputs, lambda alias, name: routes.get(name))

    def stream(provider: str, tokens: int, duration: float, ttft: float) -> None:
        record = Record("r", "chat/completions", [], stream=True, alias="m",
                        provider=provider, ttft=ttft, usage=Usage(completion_tokens=tokens))
        record.outcome, record.duration = Outcome.COMPLETED, duration
        listener(record)

    stream("a", 100, 2.5, 0.5)  # 50 tokens/s
    stream("b", 100, 1.5, 0.5)  # 100 tokens/s
    assert throughputs.of(A) == pytest.approx(50.0) and throughputs.of(B) == pytest.approx(100)
    assert sorting.by_throughput((A, B, C), throughputs) == (C, B, A), "unmeasured first"


def test_the_provider_object_is_taken_out_of_the_body() -> None:
    raw = msgspec.json.encode({"model": "m", "provider": {"sort": "latency",
                                                          "max_price": {"prompt": 1}}})
    body, sort, ceiling = sorting.taken(raw)
    assert msgspec.json.decode(body) == {"model": "m"}
    assert sort == "latency" and ceiling == MaxPrice(prompt=1.0)
    untouched = b'{"model": "m", "messages": [{"role": "user", "content": "provider"}]}'
    assert sorting.taken(untouched) == (untouched, None, None)
    with pytest.raises(InvalidRequest):
        sorting.taken(b'{"provider": "openai"}')
