"""Whatever bytes arrive, the gateway answers with JSON it meant to send: never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway import openapi
from tests.conftest import Pair
from tests.fake_anthropic import FakeAnthropic
from tests.fake_gemini import FakeGemini
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["chat-model", "nope", ""]) | JSON,
    "messages": st.lists(st.fixed_dictionaries({}, optional={"role": JSON | st.just("user"),
                                                            "content": JSON}), max_size=3)
    | JSON,
    "prompt": JSON,
    "stream": st.booleans() | JSON,
    "n": JSON,
})
BODIES = (FIELDS.map(lambda d: json.dumps(d).encode()) | JSON.map(lambda v: json.dumps(v).encode())
          | st.binary(max_size=200))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=BODIES, path=st.sampled_from(["chat/completions", "completions"]))
def test_no_body_makes_the_gateway_fail(pair: Pair, body: bytes, path: str) -> None:
    response = httpx.post(f"{pair.gateway.base_url}/{path}", content=body,
                          headers={"Content-Type": "application/json"}, timeout=10)

    assert response.status_code != 500, response.text
    assert "Traceback" not in response.text
    if response.headers["content-type"].startswith("application/json"):
        payload = response.json()
        assert "choices" in payload or set(payload) == {"error"}
    else:
        assert response.headers["content-type"].startswith("text/event-stream")


# -- every endpoint, every provider kind ---------------------------------------------------------

KIND_ALIASES = ["openai-m", "anthropic-m", "google-m", "ollama-m"]
ENDPOINTS = ["chat/completions", "completions", "responses"]
RESPONSES_INPUT = st.one_of(
    JSON, st.text(), st.lists(st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning",
                                 "input_text"]) | JSON,
        "role": st.sampled_from(["user", "assistant"]) | JSON,
        "content": JSON, "call_id": JSON, "name": JSON, "arguments": JSON, "output": JSON,
    }), max_size=3))
EVERY_FIELD = st.fixed_dictionaries({"model": st.sampled_from(KIND_ALIASES)}, optional={
    "messages": FIELDS.map(lambda d: d.get("messages", [])),
    "prompt": JSON, "input": RESPONSES_INPUT, "stream": st.booleans(), "n": JSON,
    "tools": JSON, "tool_choice": JSON, "response_format": JSON, "text": JSON,
    "reasoning": JSON, "max_tokens": JSON, "temperature": JSON, "stop": JSON,
})


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway with a provider of every kind that speaks HTTP, each on its own fake."""
    with FakeUpstream(name="oa") as oa, FakeAnthropic(name="an") as an, \
            FakeGemini(name="gm") as gm, FakeUpstream(name="ol") as ol:
        gateway = GatewayProcess(tmp_path_factory.mktemp("kinds"), config({
            "openai": provider(oa.base_url, {"openai-m": "m"}),
            "anthropic": {"type": "anthropic", "base_url": an.base_url.removesuffix("/v1"),
                          "api_key": "an-key-000000", "models": {"anthropic-m": "m"}},
            "google": {"type": "google", "base_url": gm.base_url, "api_key": "gm-key-000000",
                       "models": {"google-m": "gemini-2.5-flash"}},
            "ollama": {"type": "ollama", "base_url": ol.base_url, "models": {"ollama-m": "m"}},
        }, defaults={"circuit": {"enabled": False}}))
        gateway.start()
        yield gateway
        gateway.stop()


@settings(max_examples=240, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=EVERY_FIELD.map(lambda d: json.dumps(d).encode()), path=st.sampled_from(ENDPOINTS))
def test_no_body_makes_any_kind_fail_on_any_endpoint(every_kind: GatewayProcess, body: bytes,
                                                     path: str) -> None:
    response = httpx.post(f"{every_kind.base_url}/{path}", content=body, timeout=15,
                          headers={"Content-Type": "application/json"})

    assert response.status_code < 500, response.text
    if response.status_code >= 400:  # the envelope, whoever refused it
        assert {"message", "type", "code", "param"} <= set(response.json()["error"])


SCHEMA = schemathesis.openapi.from_dict(openapi.document())


@pytest.mark.parametrize("path", list(openapi.ROUTES))
def test_schemathesis_finds_no_server_error_on_the_relay_routes(every_kind: GatewayProcess,
                                                                path: str) -> None:
    cases = []

    @settings(max_examples=60, deadline=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=SCHEMA[path]["POST"].as_strategy(), model=st.sampled_from(KIND_ALIASES))
    def run(case: Any, model: str) -> None:
        if isinstance(case.body, dict):
            case.body["model"] = model
        response = case.call(base_url=every_kind.url, timeout=15)
        cases.append(response.status_code)
        assert response.status_code < 500, response.text

    run()
    # Generated bodies reached the providers, not only the gateway's own checks.
    print(f"schemathesis {path}: {len(cases)} cases, statuses {sorted(set(cases))}")
    assert len(cases) >= 30 and 200 in cases
