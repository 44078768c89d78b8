"""`client.responses` works for every model: natively where a provider has it, bridged elsewhere."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.upstream import FakeUpstream, ok, status, stream_cut, tool_call

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
COLOUR = {"format": {"type": "json_schema", "name": "color", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "hex": {"type": "string"}},
    "required": ["name", "hex"]}}}


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    ups = {name: FakeUpstream(name=name).start() for name in ("chat", "backup", "native")}
    yield ups
    for up in ups.values():
        up.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    doc = config({
        "chat": provider(fakes["chat"].base_url, {"kimi": "moonshotai/kimi-k2.5"}),
        "backup": provider(fakes["backup"].base_url, {"kimi": "kimi-backup"}),
        "native": provider(fakes["native"].base_url, {"native-model": "native-id"},
                           responses=True),
    }, defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("responses"), doc).start()
    yield process
    process.stop()


@pytest.fixture
def client(gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> openai.OpenAI:
    for up in fakes.values():
        up.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def raw_response(gateway: GatewayProcess, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"{gateway.base_url}/responses", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_plain_input_through_a_chat_only_provider(client: openai.OpenAI,
                                                  gateway: GatewayProcess,
                                                  fakes: dict[str, FakeUpstream]) -> None:
    response = client.responses.create(model="kimi",
                                       input="Explain GPU inference in two sentences.")

    assert response.output_text == "Hello from chat"
    assert response.status == "completed" and response.usage is not None
    assert response.usage.output_tokens == 3
    sent = fakes["chat"].last_json
    assert fakes["chat"].requests[-1].path == "/v1/chat/completions"
    assert sent["model"] == "moonshotai/kimi-k2.5"
    assert sent["messages"] == [{"role": "user",
                                 "content": "Explain GPU inference in two sentences."}]
    validate(raw_response(gateway, model="kimi", input="hi"), "Response")


def test_instructions_and_sampling_translate(client: openai.OpenAI,
                                             fakes: dict[str, FakeUpstream]) -> None:
    client.responses.create(model="kimi", instructions="Answer like a pirate.",
                            input="Hello", temperature=0.2, top_p=0.9, max_output_tokens=50,
                            reasoning={"effort": "low"}, metadata={"team": "a"})

    sent = fakes["chat"].last_json
    assert sent["messages"][0] == {"role": "system", "content": "Answer like a pirate."}
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.2, 0.9, 50)
    assert sent["reasoning_effort"] == "low"


def test_json_schema_colour(client: openai.OpenAI, fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].set_mode(ok(content='{"name": "teal", "hex": "#008080"}'))

    response = client.responses.create(model="kimi", text=COLOUR,
                                       input="Give me a color with its name and hex code.")

    assert json.loads(response.output_text) == {"name": "teal", "hex": "#008080"}
    assert fakes["chat"].last_json["response_format"] == {
        "type": "json_schema",
        "json_schema": {key: COLOUR["format"][key] for key in ("name", "schema", "strict")}}


def test_flat_tool_weather_round_trip(client: openai.OpenAI,
                                      fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].set_mode(tool_call("get_weather", '{"city": "Paris"}',
                                     reasoning="Need the weather tool."))

    first = client.responses.create(model="kimi", input="What's the weather in Paris?",
                                    tools=[WEATHER], tool_choice="auto")

    assert fakes["chat"].last_json["tools"] == [{"type": "function", "function": {
        key: WEATHER[key] for key in ("name", "description", "parameters")}}]
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"]
    call = first.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})

    fakes["chat"].set_mode(ok(content="It is 18°C in Paris."))
    second = client.responses.create(model="kimi", tools=[WEATHER], input=[
        {"role": "user", "content": "What's the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 18}'}])

    messages = fakes["chat"].last_json["messages"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id,
                           "content": '{"temp": 18}'}
    assert second.output_text == "It is 18°C in Paris."


def test_streaming_bridge_emits_the_event_sequence_the_sdk_expects(
        client: openai.OpenAI, gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].set_mode(ok(reasoning="Thinking it over.", content="Two sentences."))

    with client.responses.stream(model="kimi", input="Explain.") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    assert final.output_text == "Two sentences."
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.reasoning_text.delta" in kinds
    assert kinds.count("response.output_text.delta") == 2
    for expected in ("response.content_part.added", "response.output_text.done",
                     "response.output_item.done"):
        assert expected in kinds
    assert kinds[-1] == "response.completed"
    assert fakes["chat"].last_json["stream"] is True

    body = httpx.post(f"{gateway.base_url}/responses",
                      json={"model": "kimi", "input": "x", "stream": True}).text
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        validate(event, "ResponseStreamEvent")


def test_streamed_tool_call_arrives_as_function_call_events(
        client: openai.OpenAI, fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].set_mode(tool_call("get_weather", '{"city": "Oslo"}'))

    with client.responses.stream(model="kimi", input="Weather?", tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    call = next(item for item in final.output if item.type == "function_call")
    assert json.loads(call.arguments) == {"city": "Oslo"}


def test_cut_by_length_is_incomplete(client: openai.OpenAI,
                                     fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].set_mode(ok(finish_reason="length"))

    response = client.responses.create(model="kimi", input="Go on", max_output_tokens=3)

    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def test_a_native_provider_gets_the_request_as_is(client: openai.OpenAI,
                                                  fakes: dict[str, FakeUpstream]) -> None:
    response = client.responses.create(model="native-model", input="Hello",
                                       text={"format": {"type": "text"}})
    with client.responses.stream(model="native-model", input="Hello") as stream:
        streamed = stream.get_final_response()

    assert response.output_text == streamed.output_text == "Hello from native"
    assert fakes["native"].requests[0].path == "/v1/responses"
    assert fakes["native"].requests[0].json == {"model": "native-id", "input": "Hello",
                                                "text": {"format": {"type": "text"}}}


def test_failover_applies_to_responses(client: openai.OpenAI,
                                       fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].set_mode(status(503))

    raw = client.responses.with_raw_response.create(model="kimi", input="Hello")

    assert raw.headers["x-llms-provider"] == "backup"
    assert raw.parse().output_text == "Hello from backup"


def test_a_stream_that_breaks_ends_with_response_failed(gateway: GatewayProcess,
                                                        fakes: dict[str, FakeUpstream]) -> None:
    fakes["chat"].reset()
    fakes["chat"].set_mode(stream_cut(after_chunks=2))

    body = httpx.post(f"{gateway.base_url}/responses",
                      json={"model": "kimi", "input": "x", "stream": True}).text
    kinds = [json.loads(line[6:])["type"] for line in body.splitlines()
             if line.startswith("data: ")]

    assert kinds[-2:] == ["error", "response.failed"]
    assert "response.completed" not in kinds


def test_previous_response_id_continues_the_conversation(
        client: openai.OpenAI, fakes: dict[str, FakeUpstream]) -> None:
    first = client.responses.create(model="kimi", input="My name is Ada.")

    client.responses.create(model="kimi", input="What is my name?",
                            previous_response_id=first.id)

    assert fakes["chat"].last_json["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello from chat"}]},
        {"role": "user", "content": "What is my name?"}]
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="kimi", input="x", previous_response_id="resp_nope")
    assert missing.value.body["code"] == "response_not_found"  # type: ignore[index]


def test_streamed_responses_are_counted_in_the_request_log(
        client: openai.OpenAI, gateway: GatewayProcess) -> None:
    with client.responses.stream(model="kimi", input="Hello") as stream:
        stream.get_final_response()
    with client.responses.stream(model="native-model", input="Hello") as stream:
        stream.get_final_response()

    bridged, native = gateway.log_events("request")[-2:]
    assert bridged["tokens"] == 7 and bridged["outcome"] == "completed"
    assert native["tokens"] is not None and native["tokens"] > 0


def test_with_redis_a_follow_up_can_reach_another_gateway(
        tmp_path_factory: pytest.TempPathFactory, redis_server: Any,
        fakes: dict[str, FakeUpstream]) -> None:
    doc = config({"chat": provider(fakes["chat"].base_url, {"kimi": "k"})},
                 state={"backend": "redis", "url": redis_server.url})
    first = GatewayProcess(tmp_path_factory.mktemp("r1"), doc).start()
    second = GatewayProcess(tmp_path_factory.mktemp("r2"), doc).start()
    try:
        opened = raw_response(first, model="kimi", input="My name is Ada.")
        raw_response(second, model="kimi", input="And mine?",
                     previous_response_id=opened["id"])
        assert fakes["chat"].last_json["messages"][0] == {"role": "user",
                                                          "content": "My name is Ada."}
    finally:
        first.stop()
        second.stop()
