"""Traces, as a collector receives them: the gateway exports OTLP/HTTP protobuf to a real
receiver (tests/otlp_receiver.py), and each story asserts the tree of its request's trace."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config.loader import parse
from gateway.config.snapshots import secrets
from gateway.core.settings import ConfigError, Telemetry
from gateway.observe.traced_sampling import Rule, rule
from tests.gateway_process import ROOT, GatewayProcess, config, provider
from tests.otlp_receiver import CLIENT, SERVER, OtlpReceiver, Received, children, one
from tests.upstream import FakeUpstream, hang, status, stream_cut

HI = [{"role": "user", "content": "hello there"}]
KEY, PRIVATE_KEY = "gw-team-key-1234567", "gw-private-key-7654321"
UPSTREAM_KEY = "sk-test-secret-123456"  # tests.gateway_process.provider's
# Export soon after a span ends: the tests wait for spans by polling, never by sleeping.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


@dataclass
class Traced:
    gateway: GatewayProcess
    receiver: OtlpReceiver
    first: FakeUpstream
    second: FakeUpstream

    def post(self, request_id: str, model: str = "m", key: str = KEY,
             **extra: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {key}", "x-request-id": request_id,
                   **extra.pop("headers", {})}
        return httpx.post(f"{self.gateway.base_url}/chat/completions", headers=headers,
                          timeout=30, json={"model": model, "messages": HI, **extra})

    def spans(self, request_id: str, count: int) -> list[Received]:
        return self.receiver.trace(request_id, until=lambda spans: len(spans) >= count)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    with OtlpReceiver() as receiver, FakeUpstream(name="first") as first, \
            FakeUpstream(name="second") as second:
        doc = config({
            "first": provider(first.base_url, {"m": "first-id", "h": "first-h", "c": "first-c"}),
            "second": provider(second.base_url, {"m": "second-id", "h": "second-h"}),
        }, server={"api_keys": [{"key": KEY, "id": "team-a"},
                                {"key": PRIVATE_KEY, "id": "team-p", "private": True}]},
            defaults={"circuit": {"enabled": False}},
            models={"h": {"routing": {"hedge_after": 0.2, "hedge_budget": 1}},
                    "c": {"cache": {"ttl": 60}}},
            telemetry={"otlp_endpoint": receiver.endpoint, "service_name": "gw-under-test",
                       "capture_content": True, "max_content_bytes": 64})
        gateway = GatewayProcess(tmp_path_factory.mktemp("traced"), doc, env=FAST_EXPORT)
        gateway.start()
        yield Traced(gateway, receiver, first, second)
        gateway.stop()


@pytest.fixture
def fresh(traced: Traced) -> Traced:
    traced.first.reset()
    traced.second.reset()
    return traced


def server_of(spans: list[Received]) -> Received:
    return one(spans, kind=SERVER)


def no_secret_in(spans: list[Received], *secrets: str) -> None:
    text = repr([(s.name, s.attributes, s.events, s.status_message) for s in spans])
    for secret in secrets:
        assert secret not in text


def test_a_plain_answer_is_a_server_span_over_its_try_over_the_upstream_call(
        fresh: Traced) -> None:
    answer = fresh.post("plain-1")
    assert answer.status_code == 200

    spans = fresh.spans("plain-1", 3)
    server = server_of(spans)
    assert server.name == "chat m" and server.service == "gw-under-test"
    assert server.attributes["gen_ai.operation.name"] == "chat"
    assert server.attributes["gen_ai.request.model"] == "m" == server.attributes["llms.alias"]
    assert server.attributes["gen_ai.response.model"] == "first-id"
    assert server.attributes["gen_ai.provider.name"] == "openai"
    assert server.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert server.attributes["gen_ai.usage.input_tokens"] > 0
    assert server.attributes["gen_ai.usage.output_tokens"] > 0
    assert server.attributes["llms.key_id"] == "team-a"
    assert server.attributes["llms.provider"] == "first"
    assert server.attributes["llms.attempts"] == 1
    assert server.attributes["llms.cache_hit"] is False
    assert server.attributes["llms.hedged"] is False
    assert server.attributes["http.response.status_code"] == 200
    assert not server.failed
    [attempt] = children(spans, server)
    assert attempt.kind == CLIENT and attempt.name == "chat first-id"
    assert attempt.attributes["llms.provider"] == "first"
    assert attempt.attributes["llms.outcome"] == "completed"
    assert attempt.attributes["llms.ttft"] >= 0
    [call] = children(spans, attempt)
    assert call.name == "POST" and call.kind == CLIENT
    assert call.attributes["http.response.status_code"] == 200
    assert call.attributes["url.full"].endswith("/v1/chat/completions")
    # The upstream got the call's own span as its parent: it may continue the trace.
    sent = fresh.first.requests[-1].headers["traceparent"]
    assert sent.split("-")[1:3] == [server.trace_id, call.span_id]
    no_secret_in(spans, KEY, UPSTREAM_KEY)


def test_content_is_recorded_bounded_redacted_and_never_for_a_private_key(
        fresh: Traced) -> None:
    pasted = [{"role": "user", "content": f"hi {UPSTREAM_KEY}"}]
    assert fresh.post("content-1", messages=pasted).status_code == 200
    assert fresh.post("content-2", key=PRIVATE_KEY).status_code == 200

    attempt = one(fresh.spans("content-1", 3), kind=CLIENT, **{"llms.provider": "first"})
    prompt = attempt.attributes["gen_ai.input.messages"]
    assert '"hi ***' in prompt and len(prompt.encode()) <= 64
    assert len(attempt.attributes["gen_ai.output.messages"].encode()) <= 64
    private = one(fresh.spans("content-2", 3), kind=CLIENT, **{"llms.provider": "first"})
    assert "gen_ai.input.messages" not in private.attributes
    assert "gen_ai.output.messages" not in private.attributes


def test_a_failover_from_a_503_shows_the_failed_try_beside_the_one_that_answered(
        fresh: Traced) -> None:
    fresh.first.set_mode(status(503, message=f"overloaded (your key {UPSTREAM_KEY})"))

    answer = fresh.post("failover-1")
    assert answer.status_code == 200 and answer.headers["x-llms-provider"] == "second"

    spans = fresh.spans("failover-1", 5)
    server = server_of(spans)
    assert server.attributes["llms.attempts"] == 2
    assert server.attributes["llms.provider"] == "second"
    assert server.attributes["gen_ai.response.model"] == "second-id"
    assert server.attributes["llms.failed"] == ["first:unavailable"]
    assert not server.failed
    failed = one(children(spans, server), **{"llms.provider": "first"})
    assert failed.failed and failed.attributes["llms.outcome"] == "failed"
    assert failed.attributes["llms.failover_reason"] == "unavailable"
    assert failed.attributes["http.response.status_code"] == 503
    assert any(name == "exception" for name, _ in failed.events)
    [call] = children(spans, failed)
    assert call.attributes["http.response.status_code"] == 503 and call.failed
    served = one(children(spans, server), **{"llms.provider": "second"})
    assert served.attributes["llms.outcome"] == "completed" and not served.failed
    no_secret_in(spans, UPSTREAM_KEY, KEY)


def test_a_hedge_won_by_the_second_candidate_is_a_sibling_of_the_try_it_beat(
        fresh: Traced) -> None:
    fresh.first.set_mode(hang())

    answer = fresh.post("hedge-1", model="h")
    assert answer.headers["x-llms-provider"] == "second"
    assert answer.headers["x-llms-hedged"] == "1"

    spans = fresh.spans("hedge-1", 6)
    server = server_of(spans)
    assert server.attributes["llms.hedged"] is True
    assert server.attributes["llms.hedge_won"] is True
    assert server.attributes["gen_ai.response.model"] == "second-h"
    under_server = children(spans, server)
    leader = one(under_server, **{"llms.provider": "first"})
    assert leader.attributes["llms.outcome"] == "cancelled"
    hedge = one(under_server, name="llms.hedge")
    [hedged] = children(spans, hedge)
    assert hedged.attributes["llms.provider"] == "second"
    assert hedged.attributes["llms.outcome"] == "completed"
    assert hedge.attributes["llms.outcome"] == "completed"
    assert len(children(spans, leader)) == len(children(spans, hedged)) == 1
    assert fresh.first.wait_for_cancel()


def test_a_stream_cut_mid_way_fails_its_try_and_its_request(fresh: Traced) -> None:
    fresh.first.set_mode(stream_cut(after_chunks=2))

    with httpx.stream("POST", f"{fresh.gateway.base_url}/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {KEY}", "x-request-id": "cut-1"},
                      json={"model": "m", "messages": HI, "stream": True}) as answer:
        body = answer.read()
    assert answer.status_code == 200 and b'"error"' in body

    spans = fresh.spans("cut-1", 3)
    server = server_of(spans)
    assert server.failed and server.attributes["llms.outcome"] == "error"
    assert server.attributes["llms.stream"] is True
    [attempt] = children(spans, server)
    assert attempt.failed and attempt.attributes["llms.outcome"] in ("failed", "cut")
    [call] = children(spans, attempt)
    assert call.failed


def test_a_cache_hit_is_a_lookup_and_no_try(fresh: Traced) -> None:
    assert fresh.post("cache-1", model="c").status_code == 200
    answer = fresh.post("cache-2", model="c")
    assert answer.headers["x-llms-cache"] == "hit"

    missed = fresh.spans("cache-1", 4)
    assert one(missed, name="llms.cache.lookup").attributes["llms.cache_hit"] is False
    spans = fresh.spans("cache-2", 2)
    server = server_of(spans)
    assert server.attributes["llms.cache_hit"] is True
    assert server.attributes["llms.attempts"] == 0
    [lookup] = children(spans, server)
    assert lookup.name == "llms.cache.lookup" and lookup.attributes["llms.cache_hit"] is True
    assert len(fresh.first.requests) == 1, "the hit called no upstream"


def test_a_client_traceparent_is_continued_up_to_the_upstream(fresh: Traced) -> None:
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"

    answer = fresh.post("continued-1", headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    assert answer.status_code == 200

    server = server_of(fresh.spans("continued-1", 3))
    assert server.trace_id == trace_id and server.parent_id == parent
    assert fresh.first.requests[-1].headers["traceparent"].split("-")[1] == trace_id


def test_a_client_trace_not_sampled_is_passed_upstream_unsampled_and_records_nothing(
        fresh: Traced) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

    answer = fresh.post("unsampled-1", headers={"traceparent": f"00-{trace_id}-{parent}-00"})
    assert answer.status_code == 200
    # The gateway's own span of it is the upstream's parent: the client's trace, not sampled.
    _, sent_trace, sent_parent, flags = fresh.first.requests[-1].headers["traceparent"].split("-")
    assert sent_trace == trace_id and sent_parent != parent
    assert int(flags, 16) & 1 == 0, "not sampled"
    # Spans are exported in the order they end: one request later, none of that trace came.
    assert fresh.post("unsampled-2").status_code == 200
    fresh.spans("unsampled-2", 3)
    assert not [s for s in fresh.receiver.spans if s.trace_id == trace_id]


def test_a_client_trace_not_sampled_keeps_its_tracestate_and_baggage_up_to_the_upstream(
        fresh: Traced) -> None:
    trace_id, parent = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"

    answer = fresh.post("unsampled-state", headers={
        "traceparent": f"00-{trace_id}-{parent}-00", "tracestate": "vendor=opaque-1",
        "baggage": "tenant=blue"})
    assert answer.status_code == 200
    sent = fresh.first.requests[-1].headers
    assert sent["traceparent"].split("-")[1] == trace_id
    assert int(sent["traceparent"].split("-")[3], 16) & 1 == 0, "not sampled"
    assert sent["tracestate"] == "vendor=opaque-1"
    assert sent["baggage"] == "tenant=blue"


def test_the_standard_environment_alone_turns_tracing_on(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("env")
    with OtlpReceiver() as receiver:
        gateway = start_gateway(config({"env": provider(upstream.base_url, {"m": "m"})}), env={
            **FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "named-by-env"})
        answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                            headers={"x-request-id": "env-1"},
                            json={"model": "m", "messages": HI})
        assert answer.status_code == 200
        spans = receiver.trace("env-1", until=lambda spans: len(spans) >= 3)
    assert server_of(spans).service == "named-by-env"
    assert "gen_ai.input.messages" not in one(spans, name="chat m", kind=CLIENT).attributes


def test_without_an_endpoint_nothing_is_traced_nor_propagated(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("off")
    gateway = GatewayProcess(tmp_path, config({"off": provider(upstream.base_url, {"m": "m"})}))
    gateway.start()
    try:
        answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "m", "messages": HI}, headers={
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    finally:
        gateway.stop()
    assert answer.status_code == 200
    assert "traceparent" not in upstream.requests[-1].headers


def test_a_trace_not_sampled_records_nothing_yet_is_passed_upstream_as_such(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("unsampled")
    with OtlpReceiver() as receiver:
        gateway = start_gateway(config({"u": provider(upstream.base_url, {"m": "m"})},
                                       telemetry={"otlp_endpoint": receiver.endpoint,
                                                  "sample_ratio": 0}), env=FAST_EXPORT)
        answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                            json={"model": "m", "messages": HI})
        assert answer.status_code == 200
        sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "m", "messages": HI}, headers={"traceparent": sampled,
                                                    "x-request-id": "sampled-by-client"})
        assert answer.status_code == 200
        # The client's sampled trace is continued; it is the only one exported.
        spans = receiver.trace("sampled-by-client", until=lambda spans: len(spans) >= 3)
    unsampled, continued = upstream.requests[-2:]
    assert int(unsampled.headers["traceparent"].split("-")[3], 16) & 1 == 0, "not sampled"
    assert continued.headers["traceparent"].split("-")[1] == sampled.split("-")[1]
    assert {s.trace_id for s in receiver.spans} == {spans[0].trace_id}


def test_the_gateway_keeps_its_own_traces_by_their_trace_id_and_passes_each_upstream(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("half")
    count = 16
    with OtlpReceiver() as receiver:
        gateway = start_gateway(config({"h": provider(upstream.base_url, {"m": "m"})},
                                       telemetry={"otlp_endpoint": receiver.endpoint,
                                                  "sample_ratio": 0.5}), env=FAST_EXPORT)
        for n in range(count):
            answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                                headers={"x-request-id": f"half-{n}"},
                                json={"model": "m", "messages": HI})
            assert answer.status_code == 200
        sent = [r.headers["traceparent"] for r in upstream.requests[-count:]]
        kept = {n: parent for n, parent in enumerate(sent) if int(parent[-2:], 16) & 1}
        exported = {n: receiver.trace(f"half-{n}", until=lambda spans: len(spans) >= 3)
                    for n in kept}
    for parent in sent:
        version, trace_id, span_id, flags = parent.split("-")
        assert version == "00" and len(trace_id) == 32 and len(span_id) == 16
        assert int(trace_id, 16) and int(span_id, 16), "valid ids"
        # The rule of the SDK's TraceIdRatioBased: the low 64 bits under the ratio's share.
        assert (int(trace_id[16:], 16) < 1 << 63) is bool(int(flags, 16) & 1)
    assert len({parent.split("-")[1] for parent in sent}) == count, "a trace each"
    # Kept or not, the other flags are the SDK's own (its "random trace id", from 1.40 on).
    assert len({int(parent[-2:], 16) & ~1 for parent in sent}) == 1
    assert 0 < len(kept) < count  # at 0.5, all or none of 16 is one chance in 32,768
    for n, spans in exported.items():  # a kept trace is the one its upstream was told of
        assert server_of(spans).trace_id == kept[n].split("-")[1]
    assert {s.trace_id for s in receiver.spans} == {p.split("-")[1] for p in kept.values()}


@pytest.mark.parametrize(("ratio", "environ", "expected"), [
    (None, {}, Rule(1.0)),
    (0.25, {"OTEL_TRACES_SAMPLER": "always_off"}, Rule(0.25)),  # llms.json wins
    (None, {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01"}, Rule(0.01)),
    (None, {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "2"}, Rule(1.0)),  # out of range: the SDK's default
    (None, {"OTEL_TRACES_SAMPLER": "TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
     Rule(0.5, parent_based=False)),
    (None, {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "x"},
     Rule(1.0, parent_based=False)),
    (None, {"OTEL_TRACES_SAMPLER": "always_off"}, Rule(0.0, parent_based=False)),
    (None, {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}, Rule(0.0)),
    (None, {"OTEL_TRACES_SAMPLER": "jaeger_remote"}, None),  # the SDK's to run
])
def test_the_sampling_rule_is_read_as_the_sdk_reads_it(
        ratio: float | None, environ: dict[str, str], expected: Rule | None) -> None:
    assert rule(ratio, environ) == expected


def test_every_relay_endpoint_is_traced_through_its_adapters(fresh: Traced) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    base = fresh.gateway.base_url
    calls = {
        "embeddings": ("embeddings", {"model": "m", "input": ["a", "b"]}),
        "messages": ("messages", {"model": "m", "max_tokens": 16, "messages": HI}),
        "responses": ("responses", {"model": "m", "input": "hello there"}),
    }
    for request_id, (path, body) in calls.items():
        answer = httpx.post(f"{base}/{path}", json=body, timeout=30,
                            headers={**auth, "x-request-id": request_id})
        assert answer.status_code == 200, answer.text
    # A previous response the gateway never stored, with only bridged candidates: refused
    # here, as without tracing (the bridge is found under the try's span).
    unknown = httpx.post(f"{base}/responses", timeout=30, headers=auth, json={
        "model": "m", "input": "again", "previous_response_id": "resp_unknown"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == \
        "response_not_found"

    for request_id, operation in (("embeddings", "embeddings"), ("messages", "chat"),
                                  ("responses", "chat")):
        spans = fresh.spans(request_id, 3)
        server = server_of(spans)
        assert server.name == f"{operation} m"
        assert server.attributes["http.route"] == f"/v1/{request_id}"
        [attempt] = children(spans, server)
        assert attempt.attributes["llms.outcome"] == "completed"
        assert children(spans, attempt), "the upstream call under its try"


def test_the_telemetry_section_is_checked_like_the_rest_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "llms.json"
    providers = {"p": provider("http://127.0.0.1:9/v1", {"m": "m"})}
    for telemetry, field in (({"sample_ratio": 2}, "telemetry.sample_ratio"),
                             ({"exporter": "grpc"}, "telemetry")):
        with pytest.raises(ConfigError, match=field):
            parse(json.dumps(config(providers, telemetry=telemetry)), path, {})
    snapshot = parse(json.dumps(config(providers, telemetry={
        "otlp_endpoint": "$COLLECTOR", "capture_content": True})), path,
        {"COLLECTOR": "https://user:collector-password@otel.example:4318"})
    assert snapshot.telemetry.otlp_endpoint == "https://user:collector-password@otel.example:4318"
    assert snapshot.telemetry.capture_content
    assert "collector-password" in secrets(snapshot), "redacted wherever it could leak"


def test_a_gateway_that_does_not_trace_loads_none_of_it() -> None:
    probe = ("import sys, gateway.app, gateway.pipeline.relay, gateway.state.runtime;"
             "print([m for m in sys.modules if m.startswith(('opentelemetry.exporter',"
             "'gateway.observe.trac', 'gateway.adapters.traced'))])")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    assert loaded.strip() == "[]"


@pytest.mark.parametrize(("section", "environ", "on"), [
    ({}, {}, False),
    ({"otlp_endpoint": "http://collector:4318"}, {}, True),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"otlp_endpoint": "http://collector:4318"}, {"OTEL_SDK_DISABLED": "true"}, False),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
     False),
])
def test_tracing_is_on_only_where_an_endpoint_is_named(
        section: dict[str, Any], environ: dict[str, str], on: bool) -> None:
    assert Telemetry(**section).wanted(environ) is on
