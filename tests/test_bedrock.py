"""An OpenAI client talks to AWS Bedrock through the gateway without knowing it: every request
SigV4-signed with the environment's credentials and checked by a fake that recomputes the
signature, streams in AWS's event-stream framing, Claude through InvokeModel.

What every kind does alike (a stream translated, a stream broken, the Responses bridge) is
told once for all of them, in tests/test_kinds.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from botocore.config import Config
from botocore.credentials import ReadOnlyCredentials
from botocore.exceptions import ClientError, EventStreamError
from botocore.session import Session

from providers.contract.errors import (
    BadUpstreamResponse,
    InvalidRequest,
    ProviderRateLimited,
    ProviderUnavailable,
)
from providers.contract.redact import mask_credentials
from providers.contract.refusals import Limit, classify
from providers.kinds.bedrock import (
    anthropic_body,
    from_environment,
    is_anthropic,
    read_options,
    sign,
)
from providers.kinds.bedrock_converse import to_chat_completion, to_converse
from providers.kinds.bedrock_stream import EventReader, StreamTranslator
from tests.fake_bedrock import (
    SIGNATURE_MISMATCH,
    TOO_LONG,
    FakeBedrock,
    event,
    exception,
    exception_event,
    frame,
)
from tests.gateway_process import GatewayProcess, provider
from tests.kinds import fresh_client, started
from tests.openapi import validate
from tests.upstream import FakeUpstream, Recorded, _words, ok, status, tool_call

KEY_ID, SECRET, TOKEN = "AKIAFAKEBEDROCK00001", "fake/Secret+Key0123456789abcdefGHIJ", "fake-tok-1"
API_KEY = "ABSKQmVkcm9ja0FQSUtleS1mYWtlLTAxMjM0NTY3ODk="
STALE_ID, STALE_SECRET = "AKIAFAKEBEDROCK00002", "an-old-secret-aws-no-longer-knows"
NOVA, CLAUDE, TITAN = ("amazon.nova-lite-v1:0", "anthropic.claude-3-5-sonnet-20240620-v1:0",
                       "amazon.titan-embed-text-v2:0")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
PIXEL = "data:image/png;base64,iVBORw0KGgo="
HI = [{"role": "user", "content": "Hi"}]
ENV = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN,
       "STALE_KEY_ID": STALE_ID, "STALE_SECRET": "not-" + STALE_SECRET,
       "EXPIRED_TOKEN": "expired-session-token-0123", "BEDROCK_API_KEY": API_KEY,
       # The developer's own AWS setup stays out of it: the chain finds the environment's keys.
       "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
       "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    fake = FakeBedrock(keys={KEY_ID: SECRET, STALE_ID: STALE_SECRET}, tokens={KEY_ID: TOKEN},
                       api_keys=(API_KEY,))
    with fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, bedrock: FakeBedrock,
            backup: FakeUpstream) -> Iterator[GatewayProcess]:
    def aws(models: dict[str, str], **extra: Any) -> dict[str, Any]:
        return {"type": "bedrock", "region": "us-east-1", "base_url": bedrock.url,
                "models": models, **extra}

    yield from started(tmp_path_factory.mktemp("bedrock"), {
        "backup-first": provider(backup.base_url, {"to-bedrock": "backup-model"}),
        "stale": aws({"signed": NOVA, "stale-only": NOVA}, aws_access_key_id="$STALE_KEY_ID",
                     aws_secret_access_key="$STALE_SECRET"),
        "expired": aws({"expiring": NOVA}, aws_access_key_id="$STALE_KEY_ID",
                       aws_secret_access_key="$STALE_SECRET",
                       aws_session_token="$EXPIRED_TOKEN"),
        "unset": aws({"unset-only": NOVA}, aws_access_key_id="$NO_SUCH_KEY_ID",
                     aws_secret_access_key="$STALE_SECRET"),
        "bedrock": aws({"nova": NOVA, "claude": CLAUDE, "titan": TITAN, "to-bedrock": NOVA,
                        "from-bedrock": NOVA, "signed": NOVA, "long": NOVA,
                        "expiring": NOVA}),
        "revoked": aws({"keyed": NOVA}, api_key="ABSKrevoked-bedrock-api-key"),
        "keyed": aws({"keyed": NOVA}, api_key="$BEDROCK_API_KEY"),
        "paced": aws({"paced": NOVA}, timeouts={"first_token": 1, "idle": 3}),
        "whole": aws({"nova-whole": NOVA, "claude-whole": CLAUDE}, stream_upstream=False),
        "backup": provider(backup.base_url, {"from-bedrock": "backup-model",
                                             "signed": "backup-model", "long": "backup-model"}),
    }, ENV)


@pytest.fixture
def client(gateway: GatewayProcess, bedrock: FakeBedrock,
           backup: FakeUpstream) -> openai.OpenAI:
    bedrock.refusals.clear()
    return fresh_client(gateway, bedrock, backup)


def last(fake: FakeBedrock) -> Recorded:
    return fake.requests[-1]


# -- chat, whole and streamed ------------------------------------------------------------------


def test_a_whole_answer_through_converse_signed_with_the_environments_credentials(
        client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="nova-whole", stop="END", temperature=0.5, max_tokens=64, top_p=0.9,
        messages=[{"role": "system", "content": "Be brief."}, *HI])
    answer = raw.parse()

    validate(raw.http_response.json(), "CreateChatCompletionResponse")
    assert raw.headers["x-llms-provider"] == "whole"
    assert answer.choices[0].message.content == "Hello from bedrock"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (14, 3)
    assert answer.usage.prompt_tokens_details.cached_tokens == 4  # type: ignore[union-attr]
    call = last(bedrock)
    assert call.path == f"/model/{NOVA}/converse"
    assert call.json == {"messages": [{"role": "user", "content": [{"text": "Hi"}]}],
                         "system": [{"text": "Be brief."}],
                         "inferenceConfig": {"maxTokens": 64, "temperature": 0.5, "topP": 0.9,
                                             "stopSequences": ["END"]}}
    assert call.headers["authorization"].startswith(
        f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
    assert "/us-east-1/bedrock/aws4_request" in call.headers["authorization"]
    assert call.headers["x-amz-security-token"] == TOKEN
    assert bedrock.refusals == []


def test_a_whole_answer_asked_upstream_as_a_stream_is_assembled(client: openai.OpenAI,
                                                               bedrock: FakeBedrock) -> None:
    answer = client.chat.completions.create(model="nova", messages=HI)

    assert answer.choices[0].message.content == "Hello from bedrock"
    assert last(bedrock).path == f"/model/{NOVA}/converse-stream"


def test_a_stream_longer_than_the_first_token_limit_goes_on_as_its_events_come(
        client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    bedrock.set_mode(ok(chunks=_words("one two three four five six"), delay_between_chunks=0.3))

    chunks = list(client.chat.completions.create(model="paced", stream=True, messages=HI))

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "one two three four five six"


def test_tool_calls_whole_and_streamed_and_the_results_going_back(
        client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    bedrock.set_mode(tool_call("get_weather", '{"city": "Oslo"}'))
    first = client.chat.completions.create(
        model="nova-whole", tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    with client.chat.completions.stream(model="nova", tools=[WEATHER],  # type: ignore[list-item]
                                        messages=[{"role": "user", "content": "?"}]) as stream:
        streamed = stream.get_final_completion()

    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == \
        ("tooluse_fake1", "get_weather", {"city": "Oslo"})
    again = streamed.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(again.function.arguments) == {"city": "Oslo"}
    assert streamed.choices[0].finish_reason == "tool_calls"
    assert bedrock.requests[0].json["toolConfig"] == {
        "tools": [{"toolSpec": {"name": "get_weather", "description": "Weather in a city",
                                "inputSchema": {"json": WEATHER["function"]["parameters"]}}}],
        "toolChoice": {"tool": {"name": "get_weather"}}}

    bedrock.set_mode(ok(content="12°C."))
    final = client.chat.completions.create(model="nova-whole", tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "12°C"}])

    assert final.choices[0].message.content == "12°C."
    turns = last(bedrock).json["messages"]
    assert turns[1] == {"role": "assistant", "content": [{"toolUse": {
        "toolUseId": "tooluse_fake1", "name": "get_weather", "input": {"city": "Oslo"}}}]}
    assert turns[2] == {"role": "user", "content": [{"toolResult": {
        "toolUseId": "tooluse_fake1", "content": [{"text": "12°C"}]}}]}


def test_an_image_goes_as_its_bytes(client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    client.chat.completions.create(model="nova-whole", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": PIXEL}}]}])

    assert last(bedrock).json["messages"][0]["content"] == [
        {"text": "What is this?"},
        {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}]


def test_reasoning_comes_back_as_reasoning_content(client: openai.OpenAI,
                                                   bedrock: FakeBedrock) -> None:
    bedrock.set_mode(ok(reasoning="Let me think.", content="42"))

    whole = client.chat.completions.create(model="nova-whole", messages=HI)
    streamed = list(client.chat.completions.create(model="nova", stream=True, messages=HI))

    extra = whole.choices[0].message.model_extra or {}
    assert (extra["reasoning_content"], whole.choices[0].message.content) == ("Let me think.",
                                                                             "42")
    thoughts = [(c.choices[0].delta.model_extra or {}).get("reasoning_content") for c in streamed
                if c.choices]
    assert "Let me think." in thoughts


# -- Claude through InvokeModel ----------------------------------------------------------------


def test_claude_goes_through_invoke_model_with_the_messages_body(
        client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    whole = client.chat.completions.create(model="claude-whole", max_tokens=100,
                                           messages=[{"role": "system", "content": "Terse."}, *HI])
    chunks = list(client.chat.completions.create(model="claude", stream=True, messages=HI,
                                                 stream_options={"include_usage": True}))

    assert whole.choices[0].message.content == "Hello from bedrock"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    sent = bedrock.requests[0]
    assert sent.path == f"/model/{CLAUDE}/invoke"
    assert sent.json == {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 100,
                         "system": "Terse.",
                         "messages": [{"role": "user", "content": [{"type": "text",
                                                                    "text": "Hi"}]}]}
    assert last(bedrock).path == f"/model/{CLAUDE}/invoke-with-response-stream"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "Hello from bedrock"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_claudes_thinking_is_asked_for_and_comes_back_as_reasoning_content(
        client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    bedrock.set_mode(ok(reasoning="Let me think.", content="42"))

    whole = client.chat.completions.create(model="claude-whole", reasoning_effort="high",
                                           messages=HI)
    streamed = list(client.chat.completions.create(model="claude", reasoning_effort="high",
                                                   stream=True, messages=HI))

    assert bedrock.requests[0].json["thinking"] == {"type": "enabled", "budget_tokens": 16384}
    extra = whole.choices[0].message.model_extra or {}
    assert (extra["reasoning_content"], whole.choices[0].message.content) == ("Let me think.",
                                                                             "42")
    thoughts = [(c.choices[0].delta.model_extra or {}).get("reasoning_content") for c in streamed
                if c.choices]
    assert "Let me think." in thoughts


def test_claude_tool_calls_stream_back_through_the_sdk(client: openai.OpenAI,
                                                       bedrock: FakeBedrock) -> None:
    bedrock.set_mode(tool_call("get_weather", '{"city": "Bergen"}'))

    with client.chat.completions.stream(model="claude", tools=[WEATHER],  # type: ignore[list-item]
                                        messages=[{"role": "user", "content": "?"}]) as stream:
        final = stream.get_final_completion()

    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"city": "Bergen"}
    assert final.choices[0].finish_reason == "tool_calls"


# -- embeddings --------------------------------------------------------------------------------


def test_embeddings_are_one_titan_call_per_input_in_order(client: openai.OpenAI,
                                                          bedrock: FakeBedrock) -> None:
    texts = ["the cat sat", "a dog", "the cat sat on the mat"]
    answer = client.embeddings.create(model="titan", input=texts, dimensions=256)

    assert [item.index for item in answer.data] == [0, 1, 2]
    assert all(len(item.embedding) == 256 for item in answer.data)
    assert answer.usage.prompt_tokens == 3 + 2 + 6
    assert sorted(r.json["inputText"] for r in bedrock.requests) == sorted(texts)
    assert all(r.path == f"/model/{TITAN}/invoke" for r in bedrock.requests)
    same = client.embeddings.create(model="titan", input="a dog", dimensions=256)
    assert same.data[0].embedding == answer.data[1].embedding


# -- failures ----------------------------------------------------------------------------------


def test_a_wrong_secret_is_refused_by_aws_and_failed_over(client: openai.OpenAI,
                                                          bedrock: FakeBedrock) -> None:
    raw = client.chat.completions.with_raw_response.create(model="signed", messages=HI)

    assert raw.headers["x-llms-provider"] == "bedrock"
    assert bedrock.refusals == ["InvalidSignatureException"]


def test_an_expired_session_token_is_refused_and_failed_over(client: openai.OpenAI,
                                                             bedrock: FakeBedrock) -> None:
    raw = client.chat.completions.with_raw_response.create(model="expiring", messages=HI)

    assert raw.headers["x-llms-provider"] == "bedrock"
    assert bedrock.refusals == ["ExpiredTokenException"]


def test_a_bedrock_api_key_is_a_bearer_token_and_a_revoked_one_fails_over(
        client: openai.OpenAI, bedrock: FakeBedrock) -> None:
    raw = client.chat.completions.with_raw_response.create(model="keyed", messages=HI)

    assert raw.headers["x-llms-provider"] == "keyed"
    assert bedrock.refusals == ["AccessDeniedException"]
    assert last(bedrock).headers["authorization"] == f"Bearer {API_KEY}"
    assert "x-amz-date" not in last(bedrock).headers


def test_a_provider_whose_credentials_are_unset_is_disabled_with_the_reason(
        client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="NO_SUCH_KEY_ID is not set"):
        client.chat.completions.create(model="unset-only", messages=HI)


def test_a_provider_aws_refuses_alone_is_an_auth_failure_never_a_500(
        gateway: GatewayProcess, bedrock: FakeBedrock, client: openai.OpenAI) -> None:
    for stream in (False, True):
        answer = httpx.post(f"{gateway.base_url}/chat/completions",
                            json={"model": "stale-only", "messages": HI, "stream": stream})
        assert answer.status_code == 502, answer.text
        attempt = answer.json()["error"]["attempts"][0]
        assert (attempt["provider"], attempt["status"], attempt["reason"]) == \
            ("stale", 403, "rejected")
        assert SIGNATURE_MISMATCH[:40] in attempt["message"]
        assert STALE_SECRET not in answer.text
    assert bedrock.refusals == ["InvalidSignatureException"] * 2
    logs = gateway.logs()
    assert "rejected" in logs
    for secret in (SECRET, STALE_SECRET, "not-" + STALE_SECRET, TOKEN):
        assert secret not in logs


def test_failover_to_bedrock_and_from_it(client: openai.OpenAI, bedrock: FakeBedrock,
                                         backup: FakeUpstream) -> None:
    backup.set_mode(status(500))
    to = client.chat.completions.with_raw_response.create(model="to-bedrock", messages=HI)
    backup.set_mode(ok())
    bedrock.set_mode(status(503, "Bedrock is unable to process your request."))
    away = client.chat.completions.with_raw_response.create(model="from-bedrock", messages=HI)

    assert to.headers["x-llms-provider"] == "bedrock"
    assert to.parse().choices[0].message.content == "Hello from bedrock"
    assert away.headers["x-llms-provider"] == "backup"


def test_throttling_is_rate_limited_and_too_long_is_the_models_limit(
        client: openai.OpenAI, bedrock: FakeBedrock, backup: FakeUpstream) -> None:
    bedrock.set_mode(status(429, "Too many requests, please wait before trying again."))
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="nova", messages=HI)

    bedrock.set_mode(status(400, TOO_LONG))
    moved = client.chat.completions.with_raw_response.create(model="long", messages=HI)
    assert moved.headers["x-llms-provider"] == "backup"


# -- pure pieces -------------------------------------------------------------------------------


def test_signing_is_what_aws_recomputes() -> None:
    credentials = ReadOnlyCredentials(KEY_ID, SECRET, TOKEN)
    headers = sign("POST", f"https://bedrock-runtime.eu-west-1.amazonaws.com/model/{NOVA}/converse",
                   b"{}",
                   {"Content-Type": "application/json"}, credentials, "eu-west-1")

    assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")
    assert "/eu-west-1/bedrock/aws4_request, SignedHeaders=content-type;host;x-amz-date;" \
        "x-amz-security-token, Signature=" in headers["Authorization"]
    assert headers["X-Amz-Security-Token"] == TOKEN


def test_to_converse_reads_every_turn() -> None:
    body = to_converse({"messages": [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text",
                                                                        "text": "b"}]},
        {"role": "assistant", "content": ""}], "tool_choice": "required", "tools": [WEATHER],
        "response_format": {"type": "json_object"}, "max_completion_tokens": 9})

    assert body["messages"] == [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]
    assert body["system"] == [{"text": "Rules."},
                              {"text": "Respond with a single JSON object and nothing else."}]
    assert body["toolConfig"]["toolChoice"] == {"any": {}}
    assert body["inferenceConfig"] == {"maxTokens": 9}


@pytest.mark.parametrize("url", ["https://example.com/cat.png", "data:image/tiff;base64,AAAA",
                                 "data:image/png;base64,not base64!"])
def test_images_converse_cannot_take_are_the_clients_error(url: str) -> None:
    with pytest.raises(InvalidRequest):
        to_converse({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}]})


def test_a_converse_answer_in_openais_shape() -> None:
    answer = to_chat_completion({
        "output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "hm", "signature": "s"}}},
            {"text": "Hi"}, {"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": 1}}}]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 3, "outputTokens": 2, "cacheWriteInputTokens": 1}},
        "m", "req-1")

    assert answer["id"] == "chatcmpl-req-1"
    message = answer["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Hi", "hm")
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["usage"]["prompt_tokens"] == 4
    with pytest.raises(BadUpstreamResponse):
        to_chat_completion({"output": {}}, "m")


def test_the_stream_translator_reads_frames_split_anywhere() -> None:
    stream = b"".join([
        event("messageStart", {"role": "assistant"}),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}}),
        event("messageStop", {"stopReason": "max_tokens"}),
        event("metadata", {"usage": {"inputTokens": 1, "outputTokens": 1}})])
    translator = StreamTranslator("m")
    out = b"".join(translator.feed(stream[i:i + 7]) for i in range(0, len(stream), 7))

    assert b'"content":"Hi"' in out and b'"finish_reason":"length"' in out
    assert out.endswith(b"data: [DONE]\n\n")
    assert translator.close() == b""


@pytest.mark.parametrize(("kind", "error"), [("throttlingException", ProviderRateLimited),
                                             ("modelStreamErrorException", ProviderUnavailable)])
def test_an_exception_message_raises_its_error(kind: str, error: type[Exception]) -> None:
    with pytest.raises(error, match=kind):
        EventReader().feed(exception(kind, "stop"))


def test_events_before_an_exception_in_the_same_read_come_out_first() -> None:
    translator = StreamTranslator("m")
    out = translator.feed(event("messageStart", {"role": "assistant"}) + event(
        "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}})
        + exception("modelStreamErrorException", "broke"))

    assert b'"content":"Hi"' in out
    with pytest.raises(ProviderUnavailable, match="broke"):
        translator.close()


def test_a_frame_with_a_bad_crc_is_a_bad_answer() -> None:
    broken = bytearray(frame({":message-type": "event", ":event-type": "x"}, b"{}"))
    broken[-1] ^= 0xFF
    with pytest.raises(BadUpstreamResponse):
        EventReader().feed(bytes(broken))


def test_an_entry_with_a_field_of_the_wrong_type_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="region"):
        read_options({"type": "bedrock", "region": 1})


def test_claude_body_and_model_ids() -> None:
    assert anthropic_body({"messages": HI, "stream": True}, CLAUDE) == {
        "anthropic_version": "bedrock-2023-05-31", "max_tokens": 4096,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    assert is_anthropic(CLAUDE) and is_anthropic("us.anthropic.claude-sonnet-4-v1:0")
    assert not is_anthropic(NOVA)
    assert from_environment("$X", {"X": "v"}) == "v" and from_environment("${Y}", {}) is None


def test_aws_credentials_in_upstream_text_are_masked() -> None:
    echoed = (f"authorization=AWS4-HMAC-SHA256 Credential={KEY_ID}/20261126/us-east-1/bedrock/"
              f"aws4_request; X-Amz-Security-Token=IQoJb3JpZ2luX2VjE+/abc=")
    masked = mask_credentials(echoed)

    assert KEY_ID not in masked and "IQoJb3JpZ2luX2VjE" not in masked
    assert classify(400, TOO_LONG, None, None) is Limit.CONTEXT



# -- the fake, against AWS's own client --------------------------------------------------------


@pytest.fixture
def aws_client(bedrock: FakeBedrock) -> Iterator[Any]:
    """botocore's own bedrock-runtime client on the fake: it validates requests against the
    service's model and parses answers with AWS's parsers (the test's HTTP, not the gateway's)."""
    bedrock.reset()
    bedrock.refusals.clear()
    client = Session().create_client(
        "bedrock-runtime", region_name="us-east-1", endpoint_url=bedrock.url,
        aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET, aws_session_token=TOKEN,
        config=Config(retries={"total_max_attempts": 1}))
    yield client
    client.close()


def test_the_translation_is_a_valid_converse_request_and_the_fake_answers_as_aws(
        aws_client: Any, bedrock: FakeBedrock) -> None:
    body = to_converse({"messages": [{"role": "system", "content": "Be brief."}, *HI],
                        "tools": [WEATHER], "tool_choice": "auto", "max_tokens": 10,
                        "stop": ["END"]})
    bedrock.set_mode(tool_call("get_weather", '{"city": "Oslo"}', content="Sure."))

    whole = aws_client.converse(modelId=NOVA, **body)
    streamed = [next(iter(e)) for e in aws_client.converse_stream(modelId=NOVA,
                                                                  **body)["stream"]]

    assert whole["output"]["message"]["content"][-1]["toolUse"]["input"] == {"city": "Oslo"}
    assert whole["stopReason"] == "tool_use" and whole["usage"]["inputTokens"] == 10
    assert streamed[0] == "messageStart" and streamed[-2:] == ["messageStop", "metadata"]
    assert "contentBlockStart" in streamed
    assert bedrock.refusals == [], "botocore's own signature passes the fake's check"


def test_the_fakes_errors_are_aws_errors_to_aws_own_client(aws_client: Any,
                                                           bedrock: FakeBedrock) -> None:
    bedrock.set_mode(exception_event("throttlingException", after_chunks=1))
    with pytest.raises(EventStreamError, match=r"\(throttlingException\)"):
        list(aws_client.converse_stream(modelId=NOVA, messages=[
            {"role": "user", "content": [{"text": "Hi"}]}])["stream"])
    bedrock.set_mode(status(400, TOO_LONG))
    with pytest.raises(aws_client.exceptions.ValidationException, match="too long"):
        aws_client.converse(modelId=NOVA, messages=[{"role": "user", "content": [{"text": "a"}]}])
    bedrock.set_mode(ok())

    titan = aws_client.invoke_model(modelId=TITAN, body=json.dumps({"inputText": "a dog"}))
    assert len(json.loads(titan["body"].read())["embedding"]) == 1024
    claude = aws_client.invoke_model_with_response_stream(modelId=CLAUDE, body=json.dumps(
        anthropic_body({"messages": HI}, CLAUDE)))
    kinds = [json.loads(part["chunk"]["bytes"])["type"] for part in claude["body"]]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    wrong = Session().create_client("bedrock-runtime", region_name="us-east-1",
                                    endpoint_url=bedrock.url, aws_access_key_id=KEY_ID,
                                    aws_secret_access_key="wrong", aws_session_token=TOKEN)
    with pytest.raises(ClientError, match="InvalidSignatureException"):
        wrong.converse(modelId=NOVA, messages=[{"role": "user", "content": [{"text": "a"}]}])
    wrong.close()
