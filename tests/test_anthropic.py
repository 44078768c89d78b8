"""An OpenAI client talks to Claude through the gateway without knowing it.

What every kind does alike (a stream translated, a stream broken, the Responses bridge) is
told once for all of them, in tests/test_kinds.py."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from providers.kinds.anthropic import to_chat_completion
from providers.kinds.anthropic_request import to_messages
from tests.fake_anthropic import OVERLOADED, FakeAnthropic
from tests.gateway_process import GatewayProcess, provider
from tests.kinds import fresh_client, started
from tests.upstream import FakeUpstream, ok, status, tool_call

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
PIXEL = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def claude() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(name="claude") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, claude: FakeAnthropic,
            backup: FakeUpstream) -> Iterator[GatewayProcess]:
    yield from started(tmp_path_factory.mktemp("anthropic"), {
        "anthropic": {"type": "anthropic", "base_url": claude.base_url,
                      "api_key": "sk-ant-test-key-0123456789",
                      "models": {"claude": "claude-sonnet-4-5"}},
        "backup": provider(backup.base_url, {"claude": "backup-model"}),
    })


@pytest.fixture
def client(gateway: GatewayProcess, claude: FakeAnthropic,
           backup: FakeUpstream) -> openai.OpenAI:
    return fresh_client(gateway, claude, backup)


def test_text_answer_and_the_request_claude_received(client: openai.OpenAI,
                                                      claude: FakeAnthropic) -> None:
    answer = client.chat.completions.create(model="claude", stop="END", temperature=0.5,
                                            messages=[{"role": "system", "content": "Be brief."},
                                                      {"role": "user", "content": "Hi"}])

    assert answer.choices[0].message.content == "Hello from claude"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens == 10
    sent = claude.last_json
    assert sent == {"model": "claude-sonnet-4-5", "system": "Be brief.", "max_tokens": 4096,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                    "temperature": 0.5, "stop_sequences": ["END"],
                    "stream": True}, "asked as a stream (early failover), answered whole"
    headers = claude.requests[-1].headers
    assert headers["x-api-key"] == "sk-ant-test-key-0123456789"
    assert headers["anthropic-version"] == "2023-06-01"


def test_tool_call_round_trip(client: openai.OpenAI, claude: FakeAnthropic) -> None:
    claude.set_mode(tool_call("get_weather", '{"city": "Oslo"}', content=""))
    first = client.chat.completions.create(
        model="claude", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]

    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == \
        ("get_weather", {"city": "Oslo"})
    assert claude.last_json["tools"] == [{"name": "get_weather",
                                          "description": "Weather in a city",
                                          "input_schema": WEATHER["function"]["parameters"]}]
    assert claude.last_json["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}

    claude.set_mode(ok(content="12°C."))
    client.chat.completions.create(model="claude", tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "12°C"}])

    turns = claude.last_json["messages"]
    assert turns[1]["content"] == [{"type": "tool_use", "id": call.id, "name": "get_weather",
                                    "input": {"city": "Oslo"}}]
    assert turns[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.id, "content": "12°C"}]}


def test_streamed_tool_call_reassembles_in_the_sdk(client: openai.OpenAI,
                                                   claude: FakeAnthropic) -> None:
    claude.set_mode(tool_call("get_weather", '{"city": "Bergen"}', content=""))

    with client.chat.completions.stream(model="claude", tools=[WEATHER],
                                        messages=[{"role": "user", "content": "?"}]) as stream:
        final = stream.get_final_completion()

    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"city": "Bergen"}


def test_images_become_image_blocks(client: openai.OpenAI, claude: FakeAnthropic) -> None:
    client.chat.completions.create(model="claude", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What are these?"},
        {"type": "image_url", "image_url": {"url": PIXEL}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}])

    blocks = claude.last_json["messages"][0]["content"]
    assert blocks[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                     "data": "iVBORw0KGgo="}}
    assert blocks[2] == {"type": "image", "source": {"type": "url",
                                                     "url": "https://example.com/cat.jpg"}}


def test_reasoning_effort_becomes_a_thinking_budget_and_thinking_comes_back(
        client: openai.OpenAI, claude: FakeAnthropic) -> None:
    claude.set_mode(ok(reasoning="Let me think.", content="42"))

    whole = client.chat.completions.create(model="claude", reasoning_effort="high",
                                           messages=[{"role": "user", "content": "?"}])
    streamed = list(client.chat.completions.create(
        model="claude", reasoning_effort="high", stream=True,
        messages=[{"role": "user", "content": "?"}]))

    assert claude.last_json["thinking"] == {"type": "enabled", "budget_tokens": 16384}
    assert claude.last_json["max_tokens"] > 16384
    assert (whole.choices[0].message.model_extra or {})["reasoning"] == "Let me think."
    thoughts = [(c.choices[0].delta.model_extra or {}).get("reasoning") for c in streamed
                if c.choices]
    assert "Let me think." in thoughts


def test_overloaded_529_fails_over_to_the_next_provider(client: openai.OpenAI,
                                                        claude: FakeAnthropic) -> None:
    claude.set_mode(status(529, body=OVERLOADED))

    raw = client.chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "user", "content": "Hi"}])

    assert raw.headers["x-llms-provider"] == "backup"
    assert raw.parse().choices[0].message.content == "Hello from backup"


@pytest.mark.parametrize(("openai_body", "expected"), [
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                {"type": "text", "text": "b"}]}]}),
    ({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 7,
      "response_format": {"type": "json_object"}, "user": "u1",
      "chat_template_kwargs": {"thinking": False}, "reasoning_effort": "high"},
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
      "max_tokens": 7, "system": "Respond with a single JSON object and nothing else.",
      "metadata": {"user_id": "u1"}}),
])
def test_request_translation_table(openai_body: dict, expected: dict) -> None:
    assert to_messages(openai_body, "m") == {"model": "m", "max_tokens": 4096, **expected}


def test_answer_translation_maps_stop_reasons_and_usage() -> None:
    answer = to_chat_completion({"id": "msg_1", "content": [{"type": "text", "text": "x"}],
                                 "stop_reason": "max_tokens",
                                 "usage": {"input_tokens": 3, "output_tokens": 4,
                                           "cache_read_input_tokens": 2}}, "m")

    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                               "prompt_tokens_details": {"cached_tokens": 2}}


def test_a_stream_event_that_is_not_json_is_a_bad_response_not_a_crash() -> None:
    from providers.contract.errors import BadUpstreamResponse
    from providers.kinds.anthropic import StreamTranslator

    translator = StreamTranslator("claude")
    with pytest.raises(BadUpstreamResponse):
        translator.feed(b"event: message_start\ndata: {not json\n\n")
