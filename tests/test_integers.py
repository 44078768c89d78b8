"""An integer no upstream can hold is the client's error, wherever it is in the body: a 400
naming its place, on every relay endpoint, whichever kind the alias routes to, never forwarded."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess

HI = [{"role": "user", "content": "hi"}]
# What each endpoint needs besides the field under test, so only that field is wrong.
BODIES: dict[str, dict[str, Any]] = {
    "chat/completions": {"messages": HI},
    "completions": {"prompt": "hi"},
    "responses": {"input": "hi"},
    "embeddings": {"input": "hi"},
    "messages": {"messages": HI, "max_tokens": 16},
    "messages/count_tokens": {"messages": HI},
}
ALIASES = ["openai-m", "anthropic-m", "google-m", "ollama-m"]
PAST_64_BITS = 2**70


def _post(gateway: GatewayProcess, endpoint: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/{endpoint}", content=body,
                      headers={"Content-Type": "application/json"}, timeout=30)


def _assert_names(response: httpx.Response, param: str) -> None:
    """A 400 naming `param`: in `param` for OpenAI's dialect; Anthropic's names it in the
    message, as Anthropic writes it."""
    assert response.status_code == 400, (param, response.text[:300])
    error = response.json()["error"]
    if "code" in error:
        assert (error["code"], error["param"]) == ("invalid_request", param)
    else:
        assert error["type"] == "invalid_request_error"
        assert f"`$.{param}`" in error["message"], error["message"]


def _body(endpoint: str, alias: str, field: str, number: bytes) -> bytes:
    head = httpx.Request("POST", "/", json={"model": alias, **BODIES[endpoint]}).content
    return head[:-1] + b', "%s": %s}' % (field.encode(), number)


@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("endpoint", list(BODIES))
def test_an_integer_past_64_bits_is_a_400_naming_its_field(every_kind: GatewayProcess,
                                                           endpoint: str, alias: str) -> None:
    for field, number in (("max_tokens", str(PAST_64_BITS).encode()),
                          ("seed", b"9" * 100_000), ("temperature", b"-" + b"9" * 100_000),
                          ("top_k", str(-(2**63) - 1).encode()), ("scale", b"1e400")):
        response = _post(every_kind, endpoint, _body(endpoint, alias, field, number))

        _assert_names(response, field)


@pytest.mark.parametrize("alias", ALIASES)
def test_max_tokens_past_64_bits_is_not_forwarded(every_kind: GatewayProcess,
                                                  alias: str) -> None:
    body = {"model": alias, "messages": HI, "max_tokens": PAST_64_BITS}

    response = httpx.post(f"{every_kind.base_url}/chat/completions", json=body, timeout=30)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize("endpoint", ["chat/completions", "messages"])
def test_a_nested_integer_names_its_path(every_kind: GatewayProcess, endpoint: str) -> None:
    content = [{"type": "text", "text": "hi"}, {"type": "text", "text": "x", "x": PAST_64_BITS}]
    body = {**BODIES[endpoint], "model": "openai-m",
            "messages": [{"role": "user", "content": content}]}

    response = httpx.post(f"{every_kind.base_url}/{endpoint}", json=body, timeout=30)

    _assert_names(response, "messages[0].content[1].x")


def test_one_integer_beside_extra_body_is_a_400_not_a_500(every_kind: GatewayProcess) -> None:
    body = _body("chat/completions", "openai-m", "extra_body", b'{"seed": %s}' % (b"9" * 5000))

    response = _post(every_kind, "chat/completions", body)

    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "extra_body.seed"


def test_what_64_bits_hold_and_digits_in_strings_are_forwarded(
        every_kind: GatewayProcess) -> None:
    """Never stricter than the API: the edges of 64 bits, and long digit runs in text, pass."""
    body = {"model": "openai-m", "seed": 2**64 - 1, "top_k": -(2**63), "scale": 1e308,
            "messages": [{"role": "user", "content": "call 123456789012345678901234567890"}]}

    response = httpx.post(f"{every_kind.base_url}/chat/completions", json=body, timeout=30)

    assert response.status_code == 200, response.text
