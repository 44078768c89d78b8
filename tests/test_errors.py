"""Every row of the error table: the right status, type and code, in OpenAI's envelope."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from tests.conftest import Pair
from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hello"}]


def post(pair: Pair, content: bytes | str, path: str = "chat/completions") -> httpx.Response:
    return httpx.post(f"{pair.gateway.base_url}/{path}", content=content,
                      headers={"Content-Type": "application/json"})


def assert_envelope(response: httpx.Response, status: int, code: str, error_type: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    validate(body, "ErrorResponse")
    assert body["error"]["code"] == code
    assert body["error"]["type"] == error_type
    assert "x-request-id" in response.headers
    return body["error"]


def test_unknown_model_is_404_model_not_found(pair: Pair) -> None:
    error = assert_envelope(post(pair, '{"model": "nope", "messages": [{"role":"user"}]}'),
                            404, "model_not_found", "invalid_request_error")
    assert error["message"] == "Model 'nope' not found in any enabled provider"
    assert error["param"] == "model"


def test_sdk_sees_not_found_error(pair: Pair) -> None:
    with pytest.raises(openai.NotFoundError):
        pair.client().chat.completions.create(model="nope", messages=MESSAGES)


@pytest.mark.parametrize(("body", "param"), [
    ("this is not json", None),
    ("", None),
    ("[1, 2]", None),
    ('{"messages": [{"role": "user", "content": "x"}]}', "model"),
    ('{"model": "chat-model"}', "messages"),
    ('{"model": "chat-model", "messages": []}', "messages"),
    ('{"model": 42, "messages": [{"role": "user"}]}', "model"),
    ('{"model": "chat-model", "messages": "hi"}', "messages"),
    ('{"model": "chat-model", "messages": [{"content": "no role"}]}', None),
    ('{"model": "chat-model", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
    ('{"model": "chat-model", "messages": [{"role": "user"}], "x": [1, 2', None),
], ids=["not-json", "empty", "array", "no-model", "no-messages", "empty-messages",
        "model-int", "messages-str", "message-no-role", "stream-str", "truncated"])
def test_bad_bodies_are_400_invalid_request(pair: Pair, body: str, param: str | None) -> None:
    error = assert_envelope(post(pair, body), 400, "invalid_request", "invalid_request_error")
    if param:
        assert error["param"] == param
    assert pair.primary.requests == []


def test_completions_needs_a_prompt(pair: Pair) -> None:
    error = assert_envelope(post(pair, '{"model": "chat-model"}', "completions"), 400,
                            "invalid_request", "invalid_request_error")
    assert error["param"] == "prompt"


def test_unknown_route_and_wrong_method_use_the_envelope(pair: Pair) -> None:
    assert_envelope(httpx.get(f"{pair.gateway.base_url}/nothing-here"), 404, "not_found",
                    "invalid_request_error")
    wrong = httpx.get(f"{pair.gateway.base_url}/chat/completions")
    assert_envelope(wrong, 405, "method_not_allowed", "invalid_request_error")
    assert "POST" in wrong.headers["allow"]


def test_body_over_the_limit_is_413(start_gateway: Callable[..., GatewayProcess],
                                    upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(upstream.base_url, {"m": "m"})},
                                   server={"max_body_bytes": 1024}))
    huge = {"model": "m", "messages": [{"role": "user", "content": "x" * 4096}]}

    response = httpx.post(f"{gateway.base_url}/chat/completions", json=huge)

    assert_envelope(response, 413, "request_too_large", "invalid_request_error")

    def chunked() -> Iterator[bytes]:  # no Content-Length: the gateway counts as it reads
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        yield from (b"x" * 512 for _ in range(8))
        yield b'"}]}'

    streamed = httpx.post(f"{gateway.base_url}/chat/completions", content=chunked(),
                          headers={"Content-Type": "application/json"})
    assert_envelope(streamed, 413, "request_too_large", "invalid_request_error")
    assert upstream.requests == []
    small = httpx.post(f"{gateway.base_url}/chat/completions",
                       json={"model": "m", "messages": MESSAGES})
    assert small.status_code == 200, "the gateway keeps serving"


def test_gateway_keys_are_required_when_configured(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("up")
    gateway = start_gateway(
        config({"up": provider(upstream.base_url, {"m": "m"})},
               server={"api_keys": ["$TEST_GATEWAY_KEY", "second-key"]}),
        env={"TEST_GATEWAY_KEY": "gw-key-1"})
    url = f"{gateway.base_url}/chat/completions"
    body = {"model": "m", "messages": MESSAGES}

    assert_envelope(httpx.post(url, json=body), 401, "invalid_api_key", "authentication_error")
    assert_envelope(httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}), 401,
                    "invalid_api_key", "authentication_error")
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer gw-key-1"}).is_success
    assert httpx.post(url, json=body, headers={"x-api-key": "second-key"}).is_success
    client = openai.OpenAI(base_url=gateway.base_url, api_key="gw-key-1", max_retries=0)
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway.base_url, api_key="bad", max_retries=0) \
            .chat.completions.create(model="m", messages=MESSAGES)
    assert upstream.requests[0].headers["authorization"] == "Bearer sk-test-secret-123456", \
        "the client's gateway key is not what the provider gets"
