"""No input makes a 500: every wrong type a translator would trip over is a 400 naming its place,
and a 500 that a bug still causes is never invisible (logged with its request id, counted)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import plugins
from tests.gateway_process import GatewayProcess, config

HI = [{"role": "user", "content": "hi"}]
# The aliases of the `every_kind` gateway (tests/conftest.py).
OA, AN, GM = "openai-m", "anthropic-m", "google-m"


CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("chat/completions", AN, {"messages": [{"role": "user", "content": 1}]},
     "messages[0].content"),
    ("chat/completions", AN, {"messages": [{"role": "user", "content": [1]}]},
     "messages[0].content[0]"),
    ("chat/completions", AN, {"messages": [{"role": "user", "content": {}}]},
     "messages[0].content"),
    ("chat/completions", AN, {"messages": [{"role": "user", "content": [[]]}]},
     "messages[0].content[0]"),
    ("chat/completions", AN, {"messages": [*HI, {"role": "assistant", "tool_calls": [1]}]},
     "messages[1].tool_calls[0]"),
    ("chat/completions", AN, {"messages": [*HI, {"role": "assistant", "tool_calls": "x"}]},
     "messages[1].tool_calls"),
    ("chat/completions", AN, {"messages": HI, "tools": "x"}, "tools"),
    ("chat/completions", AN, {"messages": HI, "tool_choice": {"function": "x"}},
     "tool_choice.function"),
    ("chat/completions", AN,
     {"messages": HI, "response_format": {"type": "json_schema", "json_schema": "x"}},
     "response_format.json_schema"),
    ("chat/completions", AN, {"messages": HI, "chat_template_kwargs": "x"},
     "chat_template_kwargs"),
    ("chat/completions", AN, {"messages": [{"role": "assistant", "function_call": "x"}]},
     "messages[0].function_call"),
    ("chat/completions", OA, {"messages": [{"role": "assistant", "function_call": "x"}]},
     "messages[0].function_call"),
    ("responses", OA, {"input": [{"type": "message"}]}, "input[0].role"),
    ("responses", AN, {"input": [{"type": "function_call"}]}, "input[0].call_id"),
    ("responses", OA, {"input": "hi", "tools": [1]}, "tools[0]"),
    ("responses", AN, {"input": "hi", "text": "x"}, "text"),
    ("responses", AN, {"input": "hi", "reasoning": "x"}, "reasoning"),
    # What a translating kind reads beyond the relay's head is typed where its translator
    # starts (`providers.contract.chat.ChatRequest`, the bridge's `Bridged`, compat's
    # `Rewritten`); each of these was a TypeError, KeyError or AttributeError in a translator,
    # blamed on the upstream as a 502.
    ("chat/completions", AN, {"messages": HI, "max_tokens": "x", "reasoning_effort": "low"},
     "max_tokens"),
    ("chat/completions", GM, {"messages": HI, "temperature": [1]}, "temperature"),
    ("chat/completions", AN,
     {"messages": [{"role": "system", "content": [{"type": "text", "text": [1]}]}, *HI]},
     "messages[0].content[0].text"),
    ("chat/completions", GM,
     {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": "x"}]}]},
     "messages[0].content[0].input_audio"),
    ("chat/completions", GM, {"messages": [*HI, {"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "f"}, "extra_content": "x"}]}]},
     "messages[1].tool_calls[0].extra_content"),
    ("chat/completions", OA, {"messages": HI, "functions": 1}, "functions"),
    ("chat/completions", OA, {"messages": HI, "function_call": {"x": 1}},
     "function_call.name"),
    ("responses", OA, {"input": "hi", "tool_choice": {"type": "function"}},
     "tool_choice.name"),
    ("responses", AN, {"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ("responses", AN, {"input": "hi", "max_output_tokens": "x", "reasoning": {
        "effort": "low"}}, "max_output_tokens"),
    ("responses", GM, {"input": "hi", "text": {"format": {"type": "json_schema",
                                                              "schema": "x"}}},
     "text.format.schema"),
    ("responses", GM, {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": 1}]}]}, "input[0].content[0].text"),
]


@pytest.mark.parametrize(("endpoint", "model", "body", "param"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES])
def test_a_wrong_type_is_a_400_naming_its_place(every_kind: GatewayProcess, endpoint: str,
                                                 model: str, body: dict[str, Any],
                                                 param: str) -> None:
    response = httpx.post(f"{every_kind.base_url}/{endpoint}", json={"model": model, **body})

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)


SERVED: list[tuple[str, dict[str, Any]]] = [
    # An image given as a bare URL string: Gemini's translator read it, Anthropic's raised.
    (AN, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "https://example.com/cat.png"}]}]}),
    # A tool's JSON schema with a `definitions` keyword that is not an object.
    (GM, {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "definitions": "x",
                                    "properties": {"a": {"type": "string"}}}}}]}),
]


@pytest.mark.parametrize(("model", "body"), SERVED, ids=[c[0] for c in SERVED])
def test_shapes_a_translator_can_read_are_served(every_kind: GatewayProcess, model: str,
                                                 body: dict[str, Any]) -> None:
    response = httpx.post(f"{every_kind.base_url}/chat/completions", json={"model": model, **body})

    assert response.status_code == 200, response.text


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions", "responses"])
@pytest.mark.parametrize("model", [OA, AN, GM])
def test_bytes_that_are_not_utf8_and_numbers_past_64_bits_are_400s(
        every_kind: GatewayProcess, endpoint: str, model: str) -> None:
    head = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "prompt": "x", ' \
           b'"input": "x"' % model.encode()
    for body in (head + b', "user": "m\xff"}', head + b', "seed": ' + b"9" * 100_000 + b"}",
                 head + b', "metadata": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        response = httpx.post(f"{every_kind.base_url}/{endpoint}", content=body,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_request"


BUGGY_KIND = """
    from providers.contract.provider import Provider

    class Kind(Provider):
        async def send(self, request, upstream_model):
            if upstream_model == "raises":
                raise RuntimeError("a bug in a plug-in")
            return None  # not a Reply: the relay trips over it once the router is done

        async def stream(self, request, upstream_model):
            raise RuntimeError("a bug in a plug-in")
            yield b""
"""


@pytest.mark.parametrize(("model", "exception"), [("raises", "RuntimeError"),
                                                  ("returns-none", "AttributeError")])
def test_a_500_from_a_bug_is_logged_with_its_request_id_and_counted(
        start_gateway: Callable[..., GatewayProcess], tmp_path: Path, model: str,
        exception: str) -> None:
    """A bug inside the relay's try (the plug-in raises), and one past it that only the front's
    last net catches (the plug-in breaks its contract): both are the same visible 500."""
    # Asked for whole answers: the plug-in's `send` is the method under test.
    gateway = start_gateway(config({"b": {"type": "buggy", "models": {model: model},
                                          "stream_upstream": False}}),
                            env=plugins.install(tmp_path, "buggy", BUGGY_KIND))

    response = httpx.post(f"{gateway.base_url}/chat/completions", json={"model": model,
                                                                       "messages": HI})

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "plug-in" not in response.text  # no details leave
    request_id = response.headers["x-request-id"]
    logged = gateway.wait_for_log("unhandled_error")[-1]
    assert logged["request_id"] == request_id and exception in logged["exception"]
    request_line = gateway.wait_for_log("request")[-1]
    assert (request_line["request_id"], request_line["status"]) == (request_id, 500)
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert any(line.startswith("llms_requests_total{") and 'status="500"' in line
               for line in metrics.splitlines()), metrics
