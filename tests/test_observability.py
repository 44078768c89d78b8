"""Operators see what happened: /metrics moves by exactly the scripted traffic, and cost adds up."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.errors import Attempt
from gateway.observe.metrics import LocalValues, Metrics, SharedValues
from gateway.routing.health import ProviderHealth
from providers.contract.usage import Usage
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, ok, slow_first_token, status
from tests.waiting import wait_until

MESSAGES = [{"role": "user", "content": "hello"}]
PRICE = {"input": 2.0, "output": 10.0}  # dollars per million tokens


def scrape(gateway: GatewayProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(f"{gateway.url}/metrics").text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def priced_pair(primary: FakeUpstream, secondary: FakeUpstream) -> dict:
    return config({
        "primary": provider(primary.base_url, {"m": {"id": "m", "price": PRICE}}),
        "secondary": provider(secondary.base_url, {"m": {"id": "m", "price": PRICE}}),
    })


def test_metrics_move_by_exactly_a_failover_a_stream_and_an_error(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    primary, secondary = upstream_factory("primary"), upstream_factory("secondary")
    gateway = start_gateway(priced_pair(primary, secondary))
    url = f"{gateway.base_url}/chat/completions"
    before = scrape(gateway)

    primary.set_mode(status(503))
    failed_over = httpx.post(url, json={"model": "m", "messages": MESSAGES})
    primary.reset()
    streamed = httpx.post(url, json={"model": "m", "messages": MESSAGES, "stream": True})
    unknown = httpx.post(url, json={"model": "attacker-chosen-x1", "messages": MESSAGES})
    after = scrape(gateway)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert failed_over.headers["x-llms-provider"] == "secondary" and unknown.status_code == 404
    assert streamed.text.rstrip().endswith("data: [DONE]")
    assert moved("llms_requests_total", endpoint="chat/completions", model="m",
                 provider="secondary", status="200") == 1
    assert moved("llms_requests_total", endpoint="chat/completions", model="m",
                 provider="primary", status="200") == 1
    assert moved("llms_requests_total", endpoint="chat/completions", model="_unknown",
                 provider="none", status="404") == 1
    assert moved("llms_failovers_total", model="m", provider="primary", reason="unavailable") == 1
    assert moved("llms_request_duration_seconds_count", model="m", provider="secondary") == 1
    assert moved("llms_request_duration_seconds_count", model="m", provider="primary") == 1
    assert moved("llms_time_to_first_token_seconds_count", model="m", provider="primary") == 1
    assert moved("llms_attempts_per_request_sum") == 3, "2 tries, then 1"
    assert moved("llms_gateway_overhead_seconds_count") == 1, "non-streamed answers only"
    assert "attacker-chosen-x1" not in httpx.get(f"{gateway.url}/metrics").text

    # The fake reports 4 prompt tokens, and 3 completion tokens for "Hello from <name>".
    usage = failed_over.json()["usage"]
    expected = (usage["prompt_tokens"] * 2.0 + usage["completion_tokens"] * 10.0) / 1e6
    assert float(failed_over.headers["x-llms-cost"]) == pytest.approx(expected, abs=1e-6)
    assert moved("llms_tokens_total", model="m", provider="secondary", kind="prompt") == \
        usage["prompt_tokens"]
    assert moved("llms_tokens_total", model="m", provider="primary", kind="completion") == 3, \
        "a stream's usage counts too"
    assert moved("llms_cost_usd_total", model="m", provider="primary") == pytest.approx(expected)
    logged = gateway.wait_for_log("request", 3)[-3:]
    assert logged[0]["cost"] == pytest.approx(expected) and logged[1]["tokens"] == 7


def test_streams_ask_for_usage_but_clients_that_did_not_ask_never_see_it(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))
    url = f"{gateway.base_url}/chat/completions"

    plain = httpx.post(url, json={"model": "m", "messages": MESSAGES, "stream": True})
    asked = httpx.post(url, json={"model": "m", "messages": MESSAGES, "stream": True,
                                  "stream_options": {"include_usage": True}})

    assert up.requests[0].json["stream_options"] == {"include_usage": True}
    assert '"usage"' not in plain.text and plain.text.rstrip().endswith("data: [DONE]")
    assert '"usage"' in asked.text
    assert gateway.wait_for_log("request", 2)[0]["tokens"] == 7


def test_the_inflight_gauge_counts_requests_holding_an_upstream(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    up.set_mode(slow_first_token(1.5), ok())
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(httpx.post, f"{gateway.base_url}/chat/completions",
                              json={"model": "m", "messages": MESSAGES}, timeout=10)
        wait_until(lambda: up.requests, what="the request held by the slow upstream")
        during = value(scrape(gateway), "llms_inflight_requests")
        assert waiting.result().status_code == 200
    after = value(scrape(gateway), "llms_inflight_requests")

    assert (during, after) == (1, 0)


def test_metrics_add_up_across_workers(start_gateway: Callable[..., GatewayProcess],
                                       upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}),
                            extra_args=("--workers", "2"))
    gateway.wait_for_log("gateway_started", count=2)  # both workers up

    sent = 0
    with httpx.Client() as client:  # fresh connections, until both workers have served
        while sent < 400 and (sent < 20 or len({
                line["pid"] for line in gateway.log_events("request")}) < 2):
            client.post(f"{gateway.base_url}/chat/completions",
                        json={"model": "m", "messages": MESSAGES},
                        headers={"Connection": "close"})
            sent += 1
    gateway.wait_for_log("request", count=sent)  # the last log lines reach the file
    samples = scrape(gateway)

    assert len({line["pid"] for line in gateway.log_events("request")}) == 2
    assert value(samples, "llms_requests_total", endpoint="chat/completions", model="m",
                 provider="up", status="200") == sent, "every worker's requests are counted"



def test_one_process_exports_exactly_what_prometheus_client_itself_would() -> None:
    # In one process the gateway keeps plain numbers (no lock per increment); scraped, they
    # must read as prometheus_client's own metric objects fed the same requests would.
    ours, theirs = LocalValues(), SharedValues(reference := CollectorRegistry())
    usage = Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7)
    answered = {"endpoint": "chat/completions", "model": "m", "provider": "p", "status": 200,
                "usage": usage}
    requests = [
        {**answered, "duration": 0.004, "ttft": None, "upstream": 0.003, "failed": (),
         "attempts": 1, "cost": 0.5},
        {**answered, "duration": 0.01, "ttft": 0.01, "upstream": None, "failed": (),  # bounds
         "attempts": 1, "cost": None},
        {**answered, "duration": 2.5, "ttft": None, "upstream": 2.4999,
         "failed": (Attempt("q", 503, "unavailable", "HTTP 503"),), "attempts": 2, "cost": 1e-6},
        {**answered, "duration": 400.0, "ttft": 0.3, "upstream": None, "failed": (),
         "attempts": 1, "cost": None},
        {**answered, "provider": None, "status": 404, "usage": None, "duration": 0.001,
         "ttft": None, "upstream": None, "failed": (), "attempts": 0, "cost": None},
    ]
    for values in (ours, theirs):
        metrics = Metrics(ProviderHealth())
        metrics.values = values
        for request in requests:
            metrics.record(**request)
    exported = CollectorRegistry()
    exported.register(ours)

    def samples(text: bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text.decode())
                for s in family.samples
                if not s.name.endswith("_created")
                and s.name not in ("llms_inflight_requests", "llms_queue_depth")}

    assert samples(generate_latest(exported)) == samples(generate_latest(reference))
    assert len(samples(generate_latest(exported))) > 60
