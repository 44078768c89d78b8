"""An OpenAI client talks to Gemini through the gateway without knowing it.

What every kind does alike (a stream translated, a stream broken, the Responses bridge) is
told once for all of them, in tests/test_kinds.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from providers.contract.errors import BadUpstreamResponse, ProviderUnavailable
from providers.kinds.google import model_ids
from providers.kinds.google_request import clean_schema, media_part, to_gemini
from providers.kinds.google_stream import StreamTranslator, to_chat_completion
from tests.fake_gemini import SIGNATURE, FakeGemini, error_body, safety_block
from tests.gateway_process import GatewayProcess, provider
from tests.kinds import fresh_client, started
from tests.openapi import validate
from tests.upstream import FakeUpstream, Recorded, ok, status, tool_call
from tests.waiting import wait_until

KEY = "AIzaSyTest-gemini-key-0123456789abcdef"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                   "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
PIXEL = "data:image/png;base64,iVBORw0KGgo="
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def gemini() -> Iterator[FakeGemini]:
    with FakeGemini(key=KEY, models=("gemini-2.5-flash", "gemini-2.5-pro"), page_size=1) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, gemini: FakeGemini,
            backup: FakeUpstream) -> Iterator[GatewayProcess]:
    def google(key: str, models: Any) -> dict[str, Any]:
        return {"type": "google", "base_url": gemini.base_url, "api_key": key, "models": models}

    yield from started(tmp_path_factory.mktemp("google"), {
        "stale": google("AIzaSyStale-key-that-google-refuses", {"keyed": "gemini-2.5-flash"}),
        "google": google(KEY, {"gemini": "gemini-2.5-flash", "keyed": "gemini-2.5-flash"}),
        "backup": provider(backup.base_url, {"gemini": "backup-model"}),
        "listed": {**google(KEY, "*"), "discover_interval": 60},
    })


def posts(fake: FakeGemini) -> list[Recorded]:
    """The generate calls the fake received (model listings left out)."""
    return [r for r in fake.requests if r.method == "POST"]


def sent(fake: FakeGemini) -> Any:
    """The body of the last generate call."""
    return posts(fake)[-1].json


@pytest.fixture
def client(gateway: GatewayProcess, gemini: FakeGemini, backup: FakeUpstream) -> openai.OpenAI:
    return fresh_client(gateway, gemini, backup)


def test_text_answer_and_the_request_gemini_received(client: openai.OpenAI,
                                                     gemini: FakeGemini) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="gemini", stop="END", temperature=0.5, max_tokens=64,
        messages=[{"role": "system", "content": "Be brief."}, *HI])
    answer = raw.parse()

    validate(raw.http_response.json(), "CreateChatCompletionResponse")
    assert raw.headers["x-llms-provider"] == "google"
    assert answer.choices[0].message.content == "Hello from gemini"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.total_tokens,
                                         answer.usage.completion_tokens) == (10, 13, 3)
    assert answer.usage.prompt_tokens_details.cached_tokens == 4  # type: ignore[union-attr]
    assert sent(gemini) == {
        "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 64, "temperature": 0.5, "stopSequences": ["END"]}}
    call = posts(gemini)[-1]
    # Asked as a stream (early failover), assembled into the whole answer the client asked for.
    assert call.path == "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
    assert call.headers["x-goog-api-key"] == KEY


def test_tool_call_round_trip(client: openai.OpenAI, gemini: FakeGemini) -> None:
    gemini.set_mode(tool_call("get_weather", '{"city": "Oslo"}'))
    first = client.chat.completions.create(
        model="gemini", tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]

    assert first.choices[0].finish_reason == "tool_calls"
    assert call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == \
        ("get_weather", {"city": "Oslo"})
    assert sent(gemini)["tools"] == [{"functionDeclarations": [{
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}]}]
    assert sent(gemini)["toolConfig"] == {"functionCallingConfig": {
        "mode": "ANY", "allowedFunctionNames": ["get_weather"]}}

    gemini.set_mode(ok(content="12°C."))
    final = client.chat.completions.create(model="gemini", tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "12°C"}])

    assert final.choices[0].message.content == "12°C."
    turns = sent(gemini)["contents"]
    assert turns[1] == {"role": "model", "parts": [{
        "functionCall": {"name": "get_weather", "args": {"city": "Oslo"}},
        "thoughtSignature": SIGNATURE}]}, "the signature Gemini gave goes back with the call"
    assert turns[2] == {"role": "user", "parts": [{"functionResponse": {
        "name": "get_weather", "response": {"content": "12°C"}}}]}


def test_streamed_tool_call_reassembles_in_the_sdk(client: openai.OpenAI,
                                                   gemini: FakeGemini) -> None:
    gemini.set_mode(tool_call("get_weather", '{"city": "Bergen"}'))

    with client.chat.completions.stream(model="gemini", tools=[WEATHER],  # type: ignore[list-item]
                                        messages=[{"role": "user", "content": "?"}]) as stream:
        final = stream.get_final_completion()

    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"city": "Bergen"}
    assert final.choices[0].finish_reason == "tool_calls"


def test_images_become_inline_data_and_file_data(client: openai.OpenAI,
                                                 gemini: FakeGemini) -> None:
    client.chat.completions.create(model="gemini", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What are these?"},
        {"type": "image_url", "image_url": {"url": PIXEL}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.webp?size=2"}}]}])

    assert sent(gemini)["contents"][0]["parts"] == [
        {"text": "What are these?"},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"fileData": {"mimeType": "image/webp",
                      "fileUri": "https://example.com/cat.webp?size=2"}}]


def test_reasoning_effort_becomes_a_thinking_budget_and_thoughts_come_back(
        client: openai.OpenAI, gemini: FakeGemini) -> None:
    gemini.set_mode(ok(reasoning="Let me think.", content="42"))

    whole = client.chat.completions.create(model="gemini", reasoning_effort="high", messages=HI)
    streamed = list(client.chat.completions.create(model="gemini", reasoning_effort="high",
                                                   stream=True, messages=HI))

    assert sent(gemini)["generationConfig"]["thinkingConfig"] == {
        "thinkingBudget": 24576, "includeThoughts": True}
    extra = whole.choices[0].message.model_extra or {}
    assert (extra["reasoning"], extra["reasoning_content"]) == ("Let me think.",) * 2
    assert whole.choices[0].message.content == "42"
    assert whole.usage.completion_tokens_details.reasoning_tokens == 7  # type: ignore[union-attr]
    thoughts = [(c.choices[0].delta.model_extra or {}).get("reasoning") for c in streamed
                if c.choices]
    assert "Let me think." in thoughts


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_blocked_for_safety_ends_in_content_filter(client: openai.OpenAI,
                                                            gemini: FakeGemini,
                                                            stream: bool) -> None:
    gemini.set_mode(safety_block())

    if stream:
        chunks = [c for c in client.chat.completions.create(model="gemini", stream=True,
                                                            messages=HI) if c.choices]
        reason, content = chunks[-1].choices[0].finish_reason, ""
    else:
        answer = client.chat.completions.create(model="gemini", messages=HI)
        reason, content = answer.choices[0].finish_reason, answer.choices[0].message.content

    assert (reason, content) == ("content_filter", "")


@pytest.mark.parametrize("code", [503, 429])
@pytest.mark.parametrize("stream", [False, True])
def test_unavailable_or_exhausted_gemini_fails_over(client: openai.OpenAI, gemini: FakeGemini,
                                                    code: int, stream: bool) -> None:
    gemini.set_mode(status(code, body=error_body(code, "The model is overloaded.")))

    raw = client.chat.completions.with_raw_response.create(model="gemini", messages=HI,
                                                           stream=stream)

    assert raw.headers["x-llms-provider"] == "backup"
    assert len(posts(gemini)) == 1


def test_a_bad_request_is_the_clients_error_and_never_shows_the_key(
        client: openai.OpenAI, gemini: FakeGemini, backup: FakeUpstream,
        gateway: GatewayProcess) -> None:
    gemini.set_mode(status(400, body=error_body(400, f"Invalid argument (key {KEY})")))

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="gemini", messages=HI)

    assert "Invalid argument" in caught.value.message
    assert KEY not in caught.value.response.text
    assert backup.requests == [], "a 400 is not failed over"
    gateway.request_line(caught.value.response.headers["x-request-id"])
    assert KEY not in gateway.logs()


def test_a_key_google_refuses_fails_over_to_the_next_provider(client: openai.OpenAI,
                                                              gemini: FakeGemini) -> None:
    raw = client.chat.completions.with_raw_response.create(model="keyed", messages=HI)

    assert raw.headers["x-llms-provider"] == "google"
    assert [r.headers["x-goog-api-key"] for r in posts(gemini)] == \
        ["AIzaSyStale-key-that-google-refuses", KEY]
    assert "AIzaSyStale" not in raw.http_response.text


def test_listed_models_are_served_by_the_discovering_provider(gateway: GatewayProcess,
                                                              client: openai.OpenAI) -> None:
    def listed() -> set[str] | None:
        ids = {m.id for m in client.models.list()}
        return ids if "gemini-2.5-pro" in ids else None

    ids = wait_until(listed, within=30, what="gemini-2.5-pro in /v1/models")

    assert {"gemini-2.5-flash", "gemini-2.5-pro"} <= ids  # followed nextPageToken (page size 1)
    assert "text-embedding-004" not in ids, "only models that can generateContent"
    raw = client.chat.completions.with_raw_response.create(model="gemini-2.5-pro", messages=HI)
    assert raw.headers["x-llms-provider"] == "listed"


# -- the pure translations, no sockets ---------------------------------------------------------

USER_A = {"role": "user", "parts": [{"text": "a"}]}


@pytest.mark.parametrize(("openai_body", "expected"), [
    ({"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "a"},
                   {"role": "user", "content": [{"type": "text", "text": "b"}]}]},
     {"systemInstruction": {"parts": [{"text": "d"}]},
      "contents": [{"role": "user", "parts": [{"text": "a"}, {"text": "b"}]}]}),
    ({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 7, "top_p": 0.9,
      "top_k": 5, "n": 2, "seed": 1, "presence_penalty": 0.1, "frequency_penalty": 0.2,
      "response_format": {"type": "json_object"}, "user": "u1", "logprobs": True},
     {"generationConfig": {"maxOutputTokens": 7, "topP": 0.9, "topK": 5, "candidateCount": 2,
                           "seed": 1, "presencePenalty": 0.1, "frequencyPenalty": 0.2,
                           "responseMimeType": "application/json"}}),
    ({"messages": [{"role": "user", "content": "a"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
            "type": "object", "properties": {"n": {"type": "integer"}},
            "additionalProperties": False}}}},
     {"generationConfig": {"responseMimeType": "application/json", "responseSchema": {
         "type": "object", "properties": {"n": {"type": "integer"}}}}}),
    ({"messages": [{"role": "user", "content": "a"}], "tools": [
        {"type": "function", "function": {"name": "now", "parameters": {
            "type": "object", "properties": {}}}}], "tool_choice": "required"},
     {"tools": [{"functionDeclarations": [{"name": "now"}]}],
      "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}),
    ({"messages": [{"role": "user", "content": "a"}], "tool_choice": "none"}, {}),
    ({"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"thinking": True}},
     {"generationConfig": {"thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True}}}),
    ({"messages": [{"role": "user", "content": "a"}], "reasoning_effort": "high",
      "enable_thinking": False}, {}),
    ({"messages": [{"role": "user", "content": "a"}],
      "chat_template_kwargs": {"enable_thinking": True}},
     {"generationConfig": {"thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True}}}),
    ({"messages": [{"role": "user", "content": "a"}], "reasoning_effort": "none"},
     {"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}}),
])
def test_request_translation_table(openai_body: dict, expected: dict) -> None:
    assert to_gemini(openai_body) == {"contents": [USER_A], **expected}


def test_tool_results_find_their_function_and_keep_json_objects() -> None:
    sent = to_gemini({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "[1]"}]}]})

    assert sent["contents"][1:] == [
        {"role": "model", "parts": [{"text": "Looking."},
                                    {"functionCall": {"name": "f", "args": {}}},
                                    {"functionCall": {"name": "g", "args": {"x": 1}}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "f", "response": {"ok": True}}},
            {"functionResponse": {"name": "g", "response": {"content": "[1]"}}}]}]


@pytest.mark.parametrize(("schema", "expected"), [
    ({"$schema": "x", "type": "object", "additionalProperties": False,
      "properties": {"a": {"type": ["string", "null"], "format": "email"}},
      "required": ["a", "ghost"]},
     {"type": "object", "properties": {"a": {"type": "string", "nullable": True}},
      "required": ["a"]}),
    ({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"},
                                       "q": {"anyOf": [{"$ref": "#/$defs/P"}, {"type": "null"}],
                                             "description": "maybe"}},
      "$defs": {"P": {"type": "object", "properties": {"k": {"const": "v"}}}}},
     {"type": "object", "properties": {
         "p": {"type": "object", "properties": {"k": {"enum": ["v"]}}},
         "q": {"type": "object", "properties": {"k": {"enum": ["v"]}}, "description": "maybe",
               "nullable": True}}}),
    ({"oneOf": [{"type": "string"}, {"type": "integer", "exclusiveMinimum": 0}]},
     {"anyOf": [{"type": "string"}, {"type": "integer"}]}),
    ({"type": "array", "items": {"$ref": "#/definitions/Loop"},
      "definitions": {"Loop": {"type": "array", "items": {"$ref": "#/definitions/Loop"}}}},
     None),
])
def test_schemas_are_cut_to_what_gemini_accepts(schema: dict, expected: dict | None) -> None:
    cleaned = clean_schema(schema)
    if expected is None:  # a recursive schema ends, cut at the depth limit
        assert json.dumps(cleaned).count("items") > 10
    else:
        assert cleaned == expected


@pytest.mark.parametrize(("url", "mime_type"), [
    ("https://x.io/a.PNG", "image/png"), ("https://x.io/doc.pdf?v=1", "application/pdf"),
    ("https://x.io/photo", "image/jpeg"), ("gs://bucket/cat.gif", "image/gif")])
def test_media_type_is_guessed_from_the_extension(url: str, mime_type: str) -> None:
    assert media_part(url) == {"fileData": {"mimeType": mime_type, "fileUri": url}}


@pytest.mark.parametrize(("gemini_reason", "called", "expected"), [
    ("STOP", False, "stop"), ("MAX_TOKENS", False, "length"), ("SAFETY", False, "content_filter"),
    ("RECITATION", False, "content_filter"), ("BLOCKLIST", False, "content_filter"),
    ("PROHIBITED_CONTENT", False, "content_filter"), ("SPII", False, "content_filter"),
    ("OTHER", False, "stop"), ("STOP", True, "tool_calls"), ("MAX_TOKENS", True, "length")])
def test_answer_translation_maps_finish_reasons(gemini_reason: str, called: bool,
                                                expected: str) -> None:
    parts: list[dict] = [{"text": "x"}]
    if called:
        parts.append({"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2ln"})
    answer = to_chat_completion({"candidates": [{"content": {"role": "model", "parts": parts},
                                                 "finishReason": gemini_reason}]}, "m")

    validate(answer, "CreateChatCompletionResponse")
    assert answer["choices"][0]["finish_reason"] == expected


def test_answer_translation_reads_candidates_thoughts_and_usage() -> None:
    answer = to_chat_completion({
        "candidates": [{"index": 1, "finishReason": "STOP", "content": {"parts": [
            {"text": "hm", "thought": True}, {"text": "B"}]}},
                       {"index": 0, "finishReason": "SAFETY"}],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 3,
                          "thoughtsTokenCount": 2, "cachedContentTokenCount": 1,
                          "totalTokenCount": 10},
        "modelVersion": "gemini-2.5-flash-001", "responseId": "r1"}, "m")

    validate(answer, "CreateChatCompletionResponse")
    assert answer["id"] == "chatcmpl-r1" and answer["model"] == "gemini-2.5-flash-001"
    assert [(c["index"], c["message"]["content"], c["finish_reason"])
            for c in answer["choices"]] == [(1, "B", "stop"), (0, "", "content_filter")]
    assert answer["choices"][0]["message"]["reasoning_content"] == "hm"
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10,
                               "prompt_tokens_details": {"cached_tokens": 1},
                               "completion_tokens_details": {"reasoning_tokens": 2}}
    with pytest.raises(BadUpstreamResponse):
        to_chat_completion({"usageMetadata": {}}, "m")


def _sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events)


def test_stream_translator_byte_by_byte_and_only_finished_streams_end_in_done() -> None:
    stream = _sse({"candidates": [{"content": {"parts": [{"text": "A"}]}, "index": 0}]},
                  {"candidates": [{"content": {"parts": [
                      {"functionCall": {"name": "f", "args": {}}}]},
                      "finishReason": "STOP", "index": 0}],
                   "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1}})
    translator = StreamTranslator("m")
    out = b"".join(translator.feed(stream[i:i + 1]) for i in range(len(stream)))
    out += translator.close()
    events = [json.loads(line[6:]) for line in out.decode().split("\n\n")
              if line.startswith("data: {")]

    for event in events:
        validate(event, "CreateChatCompletionStreamResponse")
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert deltas[:2] == [{"role": "assistant", "content": ""}, {"content": "A"}]
    assert deltas[2]["tool_calls"][0]["index"] == 0
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["usage"]["total_tokens"] == 3 and out.endswith(b"data: [DONE]\n\n")

    unfinished = StreamTranslator("m")
    unfinished.feed(_sse({"candidates": [{"content": {"parts": [{"text": "A"}]}}]}))
    assert b"[DONE]" not in unfinished.close()
    with pytest.raises(ProviderUnavailable, match="UNAVAILABLE"):
        StreamTranslator("m").feed(_sse({"error": {"code": 503, "status": "UNAVAILABLE"}}))


def test_model_listing_keeps_generate_content_models() -> None:
    assert model_ids({"models": [
        {"name": "models/gemini-2.5-flash", "supportedGenerationMethods": ["generateContent"]},
        {"name": "models/embedding-001", "supportedGenerationMethods": ["embedContent"]},
        {"name": "tunedModels/mine", "supportedGenerationMethods": ["generateContent"]}]}) == \
        ["gemini-2.5-flash", "tunedModels/mine"]
