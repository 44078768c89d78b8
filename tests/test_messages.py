"""`POST /v1/messages`: Anthropic's SDK (and Claude Code's wire format) against any alias.

A chat-only provider is reached through the translation (`providers.contract.messages`), an
`anthropic` provider gets the body natively. Every answer the gateway builds is parsed with the
SDK's own types, strictly; errors come back in Anthropic's shape with the usual statuses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pydantic
import pytest
from anthropic.types import ErrorResponse, Message, RawMessageStreamEvent

from providers.contract.messages import stop_reason
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, ok, status, stream_cut, tool_call

KEY = "team-key-000001"
ASK = [{"role": "user", "content": "Hello"}]
EVENTS = pydantic.TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    with FakeUpstream(name="primary") as primary, FakeUpstream(name="secondary") as secondary, \
            FakeAnthropic(name="claude") as claude:
        yield {"primary": primary, "secondary": secondary, "claude": claude}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    doc = config({
        "claude": {"type": "anthropic", "base_url": fakes["claude"].base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000", "models": {"claude-native": "claude-sonnet-4-5"}},
        "primary": provider(fakes["primary"].base_url, {"gpt": "gpt-upstream",
                                                        "claude-native": "gpt-upstream"}),
        "secondary": provider(fakes["secondary"].base_url, {"gpt": "gpt-backup"}),
    }, defaults={"circuit": {"enabled": False}}, server={"api_keys": [KEY]})
    process = GatewayProcess(tmp_path_factory.mktemp("messages"), doc).start()
    yield process
    process.stop()


OPENED: list[anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> Iterator[None]:
    for fake in fakes.values():
        fake.reset()
    yield
    while OPENED:  # a client left to the garbage collector leaves its socket unclosed
        OPENED.pop().close()


def client(gateway: GatewayProcess, **extra: Any) -> anthropic.Anthropic:
    extra.setdefault("api_key", KEY)
    OPENED.append(anthropic.Anthropic(base_url=gateway.url, max_retries=0, **extra))
    return OPENED[-1]


def strict(answer: Any) -> Message:
    """The answer as the SDK's `Message`, validated strictly (no coercion)."""
    return Message.model_validate(answer, strict=True)


def events(gateway: GatewayProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{gateway.base_url}/messages", json=body,
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}) as answer:
        text = answer.read().decode()
    found = []
    for block in text.strip().split("\n\n"):
        name = next(line[7:] for line in block.splitlines() if line.startswith("event: "))
        data = json.loads(next(line[6:] for line in block.splitlines()
                               if line.startswith("data: ")))
        assert data["type"] == name, "the event line names the data's type"
        found.append(data)
    return found


def test_a_chat_provider_answers_the_anthropic_sdk(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    raw = client(gateway).messages.with_raw_response.create(
        model="gpt", max_tokens=100, system="Be brief.", messages=ASK,  # type: ignore[arg-type]
        stop_sequences=["END"], metadata={"user_id": "u-1"}, extra_body={"temperature": 0.2})
    message = raw.parse()
    assert raw.headers["x-llms-provider"] == "primary"
    assert message.content[0].type == "text"
    assert message.content[0].text == "Hello from primary"
    assert message.stop_reason == "end_turn" and message.model == "gpt"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens == 3
    strict(json.loads(raw.http_response.text))
    sent = fakes["primary"].last_json
    assert sent["model"] == "gpt-upstream"
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hello"}]
    assert (sent["max_tokens"], sent["stop"], sent["temperature"], sent["user"]) == (
        100, ["END"], 0.2, "u-1")


def test_a_tool_call_and_its_result_make_a_round_trip(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
              "cache_control": {"type": "ephemeral"}}]
    fakes["primary"].set_mode(tool_call("get_weather", '{"city": "Paris"}'), ok("Sunny, 21C"))
    sdk = client(gateway)
    first = sdk.messages.create(model="gpt", max_tokens=100, tools=tools,  # type: ignore[arg-type]
                                tool_choice={"type": "any"}, messages=ASK)  # type: ignore[arg-type]
    use = next(block for block in first.content if block.type == "tool_use")
    assert first.stop_reason == "tool_use"
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    asked = fakes["primary"].last_json
    assert asked["tool_choice"] == "required"
    assert asked["tools"][0]["function"]["parameters"]["properties"] == {"city": {"type":
                                                                                   "string"}}

    second = sdk.messages.create(model="gpt", max_tokens=100, tools=tools,  # type: ignore[arg-type]
                                 messages=[*ASK, {"role": "assistant", "content": first.content},
                                           {"role": "user", "content": [
                                               {"type": "tool_result", "tool_use_id": use.id,
                                                "content": "21C and sunny"},
                                               {"type": "text", "text": "Summarise."}]}])
    assert second.content[0].text == "Sunny, 21C"  # type: ignore[union-attr]
    history = fakes["primary"].last_json["messages"]
    assert history[1]["tool_calls"][0]["id"] == use.id
    assert json.loads(history[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert history[2] == {"role": "tool", "tool_call_id": use.id, "content": "21C and sunny"}
    assert history[3] == {"role": "user", "content": "Summarise."}


def test_the_sdk_streams_text_and_assembles_the_final_message(
        gateway: GatewayProcess) -> None:
    with client(gateway).messages.stream(model="gpt", max_tokens=50,
                                         messages=ASK) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello from primary"
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 3 and final.usage.input_tokens > 0


def test_the_stream_is_anthropic_s_event_sequence_and_each_event_parses(
        gateway: GatewayProcess) -> None:
    found = events(gateway, {"model": "gpt", "max_tokens": 50, "messages": ASK,
                             "stream": True})
    names = [e["type"] for e in found]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    for event in found:
        if event["type"] != "ping":  # the SDK skips pings: its union has no type for them
            EVENTS.validate_python(event, strict=True)
    assert found[-2]["delta"]["stop_reason"] == "end_turn"


def test_thinking_maps_to_reasoning_and_reasoning_comes_back_as_thinking_blocks(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(ok("42", reasoning="Six times seven."))
    message = client(gateway).messages.create(
        model="gpt", max_tokens=3000, messages=ASK,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 2048})
    assert fakes["primary"].last_json["reasoning_effort"] == "medium"
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Six times seven."  # type: ignore[union-attr]
    with client(gateway).messages.stream(model="gpt", max_tokens=3000, messages=ASK,  # type: ignore[arg-type]
                                         thinking={"type": "enabled",
                                                   "budget_tokens": 2048}) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking"
    assert final.content[0].thinking == "Six times seven."


def test_a_length_stop_is_max_tokens_and_images_reach_the_chat_provider(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(ok("cut", finish_reason="length"))
    message = client(gateway).messages.create(model="gpt", max_tokens=1, messages=[{
        "role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "text", "text": "What is this?"}]}])
    assert message.stop_reason == "max_tokens"
    parts = fakes["primary"].last_json["messages"][0]["content"]
    assert parts[0]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="
    assert parts[1]["image_url"]["url"] == "https://example.com/a.png"
    assert parts[2] == {"type": "text", "text": "What is this?"}


def test_a_matched_stop_sequence_is_reported_when_the_server_says_which() -> None:
    vllm_choice = {"finish_reason": "stop", "stop_reason": "END"}
    assert stop_reason(vllm_choice, ["END"]) == ("stop_sequence", "END")
    assert stop_reason({"finish_reason": "stop"}, ["END"]) == ("end_turn", None)
    assert stop_reason({"finish_reason": "tool_calls"}, None) == ("tool_use", None)


def test_an_anthropic_provider_gets_the_body_natively(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    body = {"model": "claude-native", "max_tokens": 64, "messages": ASK,
            "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "top_k": 5}
    answer = httpx.post(f"{gateway.base_url}/messages", json=body, headers={"x-api-key": KEY})
    assert answer.headers["x-llms-provider"] == "claude"
    assert fakes["claude"].last_json == {**body, "model": "claude-sonnet-4-5"}, \
        "no double translation: cache_control and top_k reach Anthropic"
    assert answer.json()["id"] == "msg_fake"
    strict(answer.json())
    found = events(gateway, {**body, "stream": True})
    assert [e["type"] for e in found][-1] == "message_stop"
    assert fakes["claude"].requests[-1].headers["x-api-key"] == "an-key-000000"


def test_failover_works_for_messages_whole_and_streamed(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(503))
    raw = client(gateway).messages.with_raw_response.create(model="gpt", max_tokens=10,
                                                           messages=ASK)  # type: ignore[arg-type]
    assert raw.headers["x-llms-provider"] == "secondary"
    assert raw.parse().content[0].text == "Hello from secondary"  # type: ignore[union-attr]
    with client(gateway).messages.stream(model="gpt", max_tokens=10,
                                         messages=ASK) as stream:  # type: ignore[arg-type]
        assert "".join(stream.text_stream) == "Hello from secondary"
    fakes["primary"].set_mode(ok())
    fakes["claude"].set_mode(status(529, "Overloaded"))
    native = httpx.post(f"{gateway.base_url}/messages", headers={"x-api-key": KEY},
                        json={"model": "claude-native", "max_tokens": 5, "messages": ASK})
    assert native.headers.get("x-llms-provider") == "primary", native.text
    strict(native.json())


def test_a_stream_cut_mid_way_ends_with_an_anthropic_error_event(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(stream_cut(after_chunks=2))
    fakes["secondary"].set_mode(stream_cut(after_chunks=2))
    found = events(gateway, {"model": "gpt", "max_tokens": 10, "messages": ASK, "stream": True})
    assert found[0]["type"] == "message_start"
    assert found[-1]["type"] == "error"
    assert found[-1]["error"]["type"] in ("api_error", "overloaded_error")
    assert "message_stop" not in [e["type"] for e in found]
    ErrorResponse.model_validate(found[-1], strict=True)
    with pytest.raises(anthropic.APIStatusError), client(gateway).messages.stream(
            model="gpt", max_tokens=10, messages=ASK) as stream:  # type: ignore[arg-type]
        stream.get_final_message()


def test_count_tokens_estimates_for_chat_providers_and_asks_anthropic_natively(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    sdk = client(gateway)
    estimated = sdk.messages.count_tokens(model="gpt", messages=ASK)  # type: ignore[arg-type]
    longer = sdk.messages.count_tokens(model="gpt", messages=[  # type: ignore[arg-type]
        {"role": "user", "content": "Hello " * 400}])
    assert 0 < estimated.input_tokens < longer.input_tokens
    assert not fakes["primary"].requests, "an estimate costs no upstream call"
    native = sdk.messages.count_tokens(model="claude-native", messages=ASK)  # type: ignore[arg-type]
    assert fakes["claude"].requests[-1].path == "/v1/messages/count_tokens"
    assert fakes["claude"].last_json["model"] == "claude-sonnet-4-5"
    assert native.input_tokens > 0


def test_errors_are_in_anthropic_s_shape_with_the_usual_statuses(
        gateway: GatewayProcess) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client(gateway).messages.create(model="no-such-model", max_tokens=5,
                                        messages=ASK)  # type: ignore[arg-type]
    assert missing.value.body == {"type": "error", "error": {  # type: ignore[comparison-overlap]
        "type": "not_found_error", "message": missing.value.body["error"]["message"]}}  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        client(gateway, api_key="wrong-key-0000").messages.create(
            model="gpt", max_tokens=5, messages=ASK)  # type: ignore[arg-type]
    for body, where in [({"model": "gpt", "messages": ASK}, "max_tokens"),
                        ({"model": "gpt", "max_tokens": 5,
                          "messages": [{"role": "narrator", "content": "x"}]}, "messages[0].role"),
                        ({"model": "gpt", "max_tokens": 5, "messages": ASK,
                          "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                         "tools[0].type")]:
        answer = httpx.post(f"{gateway.base_url}/messages", json=body,
                            headers={"x-api-key": KEY})
        assert answer.status_code == 400, answer.text
        error = answer.json()
        assert ErrorResponse.model_validate(error, strict=True).error.type == \
            "invalid_request_error"
        assert where in error["error"]["message"]


def test_a_bearer_token_is_accepted_as_well_as_x_api_key(gateway: GatewayProcess) -> None:
    sdk = client(gateway, api_key=None, auth_token=KEY)
    assert sdk.messages.create(model="gpt", max_tokens=5,
                               messages=ASK).content  # type: ignore[arg-type]


@pytest.mark.parametrize("model", ["gpt", "claude-native"])
def test_the_same_sdk_calls_work_translated_and_native(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], model: str) -> None:
    """Tools, a tool result, a streamed answer with thinking: the same code, either way."""
    upstream = fakes["claude" if model == "claude-native" else "primary"]
    tools = [{"name": "lookup", "input_schema": {"type": "object",
                                                 "properties": {"q": {"type": "string"}}}}]
    upstream.set_mode(tool_call("lookup", '{"q": "llamas"}'), ok("Found 3."),
                      ok("Done.", reasoning="Think first."))
    sdk = client(gateway)
    first = sdk.messages.create(model=model, max_tokens=200, tools=tools,  # type: ignore[arg-type]
                                messages=ASK)  # type: ignore[arg-type]
    use = next(block for block in first.content if block.type == "tool_use")
    assert (first.stop_reason, use.name, use.input) == ("tool_use", "lookup", {"q": "llamas"})
    second = sdk.messages.create(model=model, max_tokens=200, tools=tools,  # type: ignore[arg-type]
                                 messages=[*ASK, {"role": "assistant", "content": first.content},
                                           {"role": "user", "content": [{
                                               "type": "tool_result", "tool_use_id": use.id,
                                               "content": "3 llamas"}]}])
    assert second.content[-1].text == "Found 3."  # type: ignore[union-attr]
    with sdk.messages.stream(model=model, max_tokens=3000, messages=ASK,  # type: ignore[arg-type]
                             thinking={"type": "enabled", "budget_tokens": 2048}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Done."
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.usage.output_tokens > 0
    assert all(r.path.endswith(("/messages", "/chat/completions")) for r in upstream.requests)


def test_usage_of_a_native_stream_is_counted_in_the_request_log(
        gateway: GatewayProcess) -> None:
    events(gateway, {"model": "claude-native", "max_tokens": 5, "messages": ASK,
                     "stream": True})
    def streamed() -> list[dict[str, Any]]:
        return [e for e in gateway.log_events("request") if e.get("endpoint") == "messages"
                and e.get("stream") and e.get("provider") == "claude"]

    wait_until(lambda: bool(streamed()))
    assert streamed()[-1]["tokens"] == 15, "10 in at message_start, 5 out at the end"
