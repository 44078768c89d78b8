"""Every documented field reaches the provider with its meaning intact, in the spelling it knows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.upstream import FakeUpstream, ok, tool_call

USER = [{"role": "user", "content": "hi"}]
IMAGE = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
         "z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    ups = {name: FakeUpstream(name=name).start() for name in ("vllm", "openai", "qwen", "plain")}
    yield ups
    for up in ups.values():
        up.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    doc = config({
        "vllm": provider(fakes["vllm"].base_url, {"vllm-model": "org/vllm-model"},
                         max_tokens_field="max_tokens", reasoning="chat_template_kwargs"),
        "openai": provider(fakes["openai"].base_url, {"openai-model": "gpt-x"},
                           max_tokens_field="max_completion_tokens",
                           reasoning="reasoning_effort"),
        "qwen": provider(fakes["qwen"].base_url, {"qwen-model": "qwen3"},
                         reasoning="enable_thinking"),
        "plain": provider(fakes["plain"].base_url, {"plain-model": "plain"},
                          legacy_functions=True, drop_params=["vendor_junk"],
                          params={"seed": 7}),
    }, defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("compat"), doc).start()
    yield process
    process.stop()


def send(gateway: GatewayProcess, fakes: dict[str, FakeUpstream], model: str,
         **fields: Any) -> tuple[httpx.Response, Any]:
    upstream = fakes[model.removesuffix("-model")]
    upstream.reset()
    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": model, "messages": USER, **fields})
    if upstream.last_json is None:  # refused by the gateway: nothing was sent
        return response, None
    sent = dict(upstream.last_json)
    assert sent.pop("stream") is True, "a whole answer is asked as a stream (early failover)"
    sent.pop("stream_options", None)
    return response, sent


PASSTHROUGH = [
    {"temperature": 0.3, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 11},
    {"frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.1,
     "logit_bias": {"50256": -100}},
    {"min_tokens": 5, "n": 2, "stop": ["\n", "END", "###", "Q:"]},
    {"stop": "END", "logprobs": True, "top_logprobs": 20},
    {"response_format": {"type": "json_schema", "json_schema": {
        "name": "colour", "strict": True,
        "schema": {"type": "object", "properties": {"hex": {"type": "string"}}}}}},
    {"response_format": {"type": "json_object"}},
    {"tools": [{"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}],
     "tool_choice": {"type": "function", "function": {"name": "weather"}},
     "parallel_tool_calls": False},
    {"tool_choice": "required"},
    {"user": "u-1", "metadata": {"team": "search"}, "structured_outputs": {"regex": "[a-z]+"}},
    {"messages": [{"role": "developer", "content": "be brief"},
                  {"role": "user", "content": [
                      {"type": "text", "text": "what is this?"},
                      {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}},
                      {"type": "image_url", "image_url": {"url": "https://example.com/c.png"}}]},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_9", "type": "function",
                       "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_9", "content": "{\"c\": 3}"}]},
]


@pytest.mark.parametrize("fields", PASSTHROUGH, ids=lambda f: "+".join(sorted(f))[:40])
def test_fields_reach_the_provider_untouched(gateway: GatewayProcess,
                                             fakes: dict[str, FakeUpstream],
                                             fields: dict[str, Any]) -> None:
    response, sent = send(gateway, fakes, "vllm-model", **fields)

    assert response.status_code == 200, response.text
    assert sent == {"model": "org/vllm-model", "messages": USER, **fields}


# Fields and values newer than the gateway's types: what it does not read is never a 400, and
# reaches the provider as sent.
NEWER = [
    {"reasoning_effort": "minimal", "verbosity": "low"},
    {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
    {"prediction": {"type": "content", "content": [{"type": "text", "text": "draft"}]}},
    {"web_search_options": {"search_context_size": "low", "user_location": {
        "type": "approximate", "approximate": {"city": "Oslo"}}}},
    {"service_tier": "flex", "prompt_cache_key": "team-7", "prompt_cache_retention": "24h",
     "safety_identifier": "user-9f2", "store": True, "metadata": {"team": "search"}},
    {"messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                  {"role": "user", "name": "ann", "content": [
                      {"type": "input_audio", "input_audio": {"data": "UklGRg==",
                                                              "format": "mp3"}},
                      {"type": "file", "file": {"file_id": "file-1"}},
                      {"type": "file", "file": {"filename": "a.pdf",
                                                "file_data": "data:application/pdf;base64,JV"}}]}]},
    {"messages": [*USER, {"role": "assistant", "content": [{"type": "refusal",
                                                            "refusal": "I can't."}]},
                  {"role": "user", "content": "please"}]},
    {"tools": [{"type": "custom", "custom": {"name": "code", "description": "run it", "format": {
        "type": "grammar", "grammar": {"syntax": "lark", "definition": "start: /.+/"}}}}],
     "tool_choice": {"type": "custom", "custom": {"name": "code"}}},
    {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "custom", "custom": {"name": "code", "input": "print(1)"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1"}]},
    {"tools": [{"type": "function", "function": {"name": "weather", "strict": True,
                                                 "parameters": {"type": "object"}}}],
     "tool_choice": {"type": "allowed_tools", "allowed_tools": {
         "mode": "auto", "tools": [{"type": "function", "function": {"name": "weather"}}]}}},
    {"response_format": {"type": "text"}, "logprobs": False, "top_logprobs": 0},
]


@pytest.mark.parametrize("fields", NEWER, ids=lambda f: "+".join(sorted(f))[:40])
def test_newer_fields_and_values_are_never_a_400_and_reach_the_provider_as_sent(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream],
        fields: dict[str, Any]) -> None:
    response, sent = send(gateway, fakes, "openai-model", **fields)

    assert response.status_code == 200, response.text
    assert sent == {"model": "gpt-x", "messages": USER, **fields}


@pytest.mark.parametrize(("model", "fields", "expected"), [
    ("vllm-model", {"max_completion_tokens": 64}, {"max_tokens": 64}),
    ("openai-model", {"max_tokens": 64}, {"max_completion_tokens": 64}),
    ("vllm-model", {"max_tokens": 64}, {"max_tokens": 64}),
    ("qwen-model", {"max_completion_tokens": 9}, {"max_completion_tokens": 9}),
    ("vllm-model", {"enable_thinking": False}, {"chat_template_kwargs": {"thinking": False}}),
    ("vllm-model", {"reasoning_effort": "high"}, {"chat_template_kwargs": {"thinking": True}}),
    ("openai-model", {"chat_template_kwargs": {"thinking": False}}, {"reasoning_effort": "low"}),
    ("openai-model", {"reasoning_effort": "high"}, {"reasoning_effort": "high"}),
    ("qwen-model", {"chat_template_kwargs": {"thinking": False, "x": 1}},
     {"enable_thinking": False, "chat_template_kwargs": {"x": 1}}),
    ("qwen-model", {"reasoning_effort": "none"}, {"enable_thinking": False}),
    ("plain-model", {"enable_thinking": True, "vendor_junk": 1},
     {"enable_thinking": True, "seed": 7}),
])
def test_provider_knobs_get_the_spelling_they_understand(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], model: str,
        fields: dict[str, Any], expected: dict[str, Any]) -> None:
    response, sent = send(gateway, fakes, model, **fields)

    assert response.status_code == 200, response.text
    sent.pop("model")
    sent.pop("messages")
    assert sent == expected


def test_literal_extra_body_is_merged_into_the_top_level(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    _, sent = send(gateway, fakes, "vllm-model", temperature=1.0,
                   extra_body={"top_k": 5, "temperature": 0.1})

    assert "extra_body" not in sent
    assert sent["top_k"] == 5 and sent["temperature"] == 0.1


LEGACY = {"functions": [{"name": "weather", "parameters": {"type": "object"}}],
          "function_call": {"name": "weather"}}


def test_deprecated_functions_become_tools_and_the_answer_comes_back_legacy(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["vllm"].reset()
    fakes["vllm"].set_mode(tool_call("weather", '{"city": "Oslo"}'))
    history = [*USER, {"role": "assistant", "content": None,
                       "function_call": {"name": "weather", "arguments": "{}"}},
               {"role": "function", "name": "weather", "content": "sunny"}]
    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "vllm-model", "messages": history, **LEGACY})
    sent = fakes["vllm"].last_json
    fakes["vllm"].set_mode(ok())

    assert sent["tools"] == [{"type": "function", "function": LEGACY["functions"][0]}]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert "functions" not in sent and "function_call" not in sent
    assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == "weather"
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "call_weather",
                                   "content": "sunny"}
    choice = response.json()["choices"][0]
    assert choice["message"]["function_call"] == {"name": "weather",
                                                  "arguments": '{"city": "Oslo"}'}
    assert choice["finish_reason"] == "function_call"


def test_a_provider_that_kept_functions_gets_them_as_sent(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    _, sent = send(gateway, fakes, "plain-model", **LEGACY)

    assert sent["functions"] == LEGACY["functions"] and "tools" not in sent


def test_reasoning_content_is_also_reasoning_whole_and_streamed(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["vllm"].set_mode(ok(reasoning="Let me think."))
    whole = httpx.post(f"{gateway.base_url}/chat/completions",
                       json={"model": "vllm-model", "messages": USER}).json()
    streamed = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "vllm-model", "messages": USER, "stream": True}).text
    fakes["vllm"].set_mode(ok())

    message = whole["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "Let me think."
    validate(whole, "CreateChatCompletionResponse")
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in streamed.splitlines()
              if line.startswith("data: {")]
    thought = next(d for d in deltas if "reasoning_content" in d)
    assert thought["reasoning"] == thought["reasoning_content"] == "Let me think."


@pytest.mark.parametrize(("fields", "param"), [
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"n": 0}, "n"),
    ({"stop": 5}, "stop"),
])
def test_out_of_bounds_fields_are_400_from_the_gateway(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], fields: dict[str, Any],
        param: str) -> None:
    response, sent = send(gateway, fakes, "vllm-model", **fields)

    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert sent is None, "nothing reached the provider"


def test_completions_logprobs_over_5_is_400(gateway: GatewayProcess) -> None:
    response = httpx.post(f"{gateway.base_url}/completions",
                          json={"model": "vllm-model", "prompt": "x", "logprobs": 6})

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "logprobs"
