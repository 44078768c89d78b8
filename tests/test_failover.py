"""Ordered failover: when the first provider fails the way DESIGN.md lists, the next one answers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import Pair
from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.upstream import (
    FakeUpstream,
    hang,
    invalid_json,
    ok,
    refusing_url,
    slow_first_token,
    sse_garbage,
    status,
)

MESSAGES = [{"role": "user", "content": "hello"}]


def chat(pair: Pair, **body: Any) -> httpx.Response:
    payload = {"model": "chat-model", "messages": MESSAGES, **body}
    return httpx.post(f"{pair.gateway.base_url}/chat/completions", json=payload, timeout=30)


@pytest.mark.parametrize("failure", [
    status(500), status(502), status(503), status(529), status(408),
    status(429, retry_after=1), status(401), status(403), status(404),
    invalid_json(),
], ids=lambda m: f"{m.kind}-{getattr(m, 'code', '')}")
def test_primary_fails_and_secondary_answers(pair: Pair, failure: Any) -> None:
    pair.primary.set_mode(failure)

    response = chat(pair)

    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello from secondary"
    assert response.headers["x-llms-provider"] == "secondary"
    assert response.headers["x-llms-attempts"] == "2"
    assert pair.secondary.last_json["model"] == "secondary-upstream-id"


@pytest.mark.parametrize("failure", [status(503), invalid_json(), sse_garbage(), status(401)],
                         ids=["503", "invalid-json", "sse-garbage", "401"])
def test_streams_fail_over_before_the_first_chunk(pair: Pair, failure: Any) -> None:
    pair.primary.set_mode(failure)

    stream = pair.client().chat.completions.create(model="chat-model", messages=MESSAGES,
                                                   stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    assert text == "Hello from secondary"


def test_client_error_from_provider_is_returned_not_failed_over(pair: Pair) -> None:
    pair.primary.set_mode(status(400, message="'messages' must contain a user turn"))

    response = chat(pair)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "'messages' must contain a user turn"
    assert error["type"] == "invalid_request_error"
    validate(response.json(), "ErrorResponse")
    assert pair.secondary.requests == []


def test_vllm_old_error_shape_becomes_our_envelope(pair: Pair) -> None:
    body = ('{"object":"error","message":"temperature must be non-negative, got -1.0.",'
            '"type":"BadRequestError","param":null,"code":400}')
    pair.primary.set_mode(status(400, body=body))

    response = chat(pair)

    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("temperature must be non-negative")
    validate(response.json(), "ErrorResponse")


def test_every_candidate_failing_lists_each_attempt(pair: Pair) -> None:
    pair.primary.set_mode(status(503))
    pair.secondary.set_mode(status(500, message="boom"))

    response = chat(pair)

    assert response.status_code == 502
    body = response.json()
    validate(body, "ErrorResponse")
    assert body["error"]["code"] == "provider_error"
    assert body["error"]["type"] == "api_error"
    assert body["error"]["message"].startswith("All providers failed for model 'chat-model'")
    assert [(a["provider"], a["status"]) for a in body["error"]["attempts"]] == [
        ("primary", 503), ("secondary", 500)]


def test_all_rate_limited_is_429_with_retry_after(pair: Pair) -> None:
    pair.primary.set_mode(status(429, retry_after=7))
    pair.secondary.set_mode(status(429, retry_after=3))

    response = chat(pair)

    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["code"] == "provider_error"


def test_sdk_raises_a_typed_error_when_all_fail(pair: Pair) -> None:
    pair.primary.set_mode(status(503))
    pair.secondary.set_mode(status(503))

    with pytest.raises(openai.APIStatusError) as caught:
        pair.client().chat.completions.create(model="chat-model", messages=MESSAGES)

    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "provider_error"  # type: ignore[index]


def test_refused_connection_fails_over(start_gateway: Callable[..., GatewayProcess],
                                       upstream_factory: Callable[[str], FakeUpstream]) -> None:
    backup = upstream_factory("backup")
    gateway = start_gateway(config({
        "down": provider(refusing_url(), {"m": "m"}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }))

    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES})

    assert response.headers["x-llms-provider"] == "backup"
    assert response.json()["choices"][0]["message"]["content"] == "Hello from backup"


def test_timeouts_move_on_and_say_which_fired(start_gateway: Callable[..., GatewayProcess],
                                              upstream_factory: Callable[[str], FakeUpstream]
                                              ) -> None:
    slow, hung, backup = (upstream_factory(n) for n in ("slow", "hung", "backup"))
    # Streams are bound by first_token; non-streamed answers arrive whole, so only by total.
    slow.set_mode(slow_first_token(5), status(503))
    hung.set_mode(hang())
    gateway = start_gateway(config({
        "slow": provider(slow.base_url, {"m": "m"}, timeouts={"first_token": 0.3}),
        "hung": provider(hung.base_url, {"m": "m"}, timeouts={"total": 0.3}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }))

    started = time.monotonic()
    streamed = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES, "stream": True})
    plain = httpx.post(f"{gateway.base_url}/chat/completions",
                       json={"model": "m", "messages": MESSAGES})
    elapsed = time.monotonic() - started

    assert streamed.headers["x-llms-provider"] == "backup"
    assert streamed.headers["x-llms-attempts"] == "3"
    assert plain.headers["x-llms-provider"] == "backup"
    assert elapsed < 4, "a hung provider must not hold the request past its timeout"
    assert hung.wait_for_cancel(timeout=3), "the abandoned upstream request must be closed"
    failed = [r["failed"] for r in gateway.wait_for_log("request", 2)]
    assert failed == [["slow:first_token_timeout", "hung:total_timeout"],
                      ["slow:unavailable", "hung:total_timeout"]]


def test_all_timed_out_is_504(start_gateway: Callable[..., GatewayProcess],
                             upstream_factory: Callable[[str], FakeUpstream]) -> None:
    hung = upstream_factory("hung")
    hung.set_mode(hang())
    gateway = start_gateway(config({
        "hung": provider(hung.base_url, {"m": "m"}, timeouts={"first_token": 0.3}),
    }))

    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES, "stream": True})

    assert response.status_code == 504
    assert response.json()["error"]["attempts"][0]["reason"] == "first_token_timeout"


def test_retries_stay_on_a_provider_then_move_on(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    flaky, backup = upstream_factory("flaky"), upstream_factory("backup")
    gateway = start_gateway(config({
        "flaky": provider(flaky.base_url, {"m": "m"}, retries={"attempts": 3, "backoff": 0.01}),
        "backup": provider(backup.base_url, {"m": "m"}),
    }))

    flaky.set_mode(status(503), status(503), ok())
    recovered = httpx.post(f"{gateway.base_url}/chat/completions",
                           json={"model": "m", "messages": MESSAGES})
    assert recovered.headers["x-llms-provider"] == "flaky"
    assert recovered.headers["x-llms-attempts"] == "3"
    assert len(flaky.requests) == 3 and backup.requests == []

    flaky.reset()
    flaky.set_mode(status(401))
    rejected = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES})
    assert rejected.headers["x-llms-provider"] == "backup"
    assert len(flaky.requests) == 1, "a provider that rejects our key is not retried"


def test_retry_after_is_honoured_between_tries(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    limited = upstream_factory("limited")
    limited.set_mode(status(429, retry_after=1), ok())
    gateway = start_gateway(config({
        "limited": provider(limited.base_url, {"m": "m"},
                            retries={"attempts": 2, "backoff": 0.01, "retry_after_cap": 5}),
    }))

    started = time.monotonic()
    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES})

    assert response.status_code == 200
    assert time.monotonic() - started >= 0.95
