"""An OpenAI client talks to Gemini and Claude on Vertex AI through the gateway, which gets its
OAuth2 tokens from a service account (or the environment's credentials) by itself.

What every kind does alike (a stream translated, a stream broken, the Responses bridge) is
told once for all of them, in tests/test_kinds.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anthropic
import google.auth.exceptions
import httpx
import openai
import pytest

from providers.contract.errors import BadUpstreamResponse, ProviderRejected, ProviderUnavailable
from providers.kinds.vertex import from_predict, model_url, read_settings, to_predict
from providers.kinds.vertex_auth import AccessTokens, refresh_error, service_account_credentials
from providers.transport import AiohttpTransport
from tests.fake_vertex import EMAIL, FakeVertex, service_account
from tests.gateway_process import GatewayProcess, provider, wait_until
from tests.kinds import fresh_client, started
from tests.openapi import validate
from tests.upstream import (
    FakeUpstream,
    Recorded,
    echo_headers,
    ok,
    refusing_url,
    status,
    tool_call,
)

PROJECT = "test-project"
CLAUDE = "claude-sonnet-4-5@20250929"
HI = [{"role": "user", "content": "Hi"}]
PIXEL = "data:image/png;base64,iVBORw0KGgo="
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
GEMINI_PATH = f"/v1/projects/{PROJECT}/locations/us-central1/publishers/google/models"
CLAUDE_PATH = f"/v1/projects/{PROJECT}/locations/us-central1/publishers/anthropic/models"


@pytest.fixture(scope="module")
def vertex() -> Iterator[FakeVertex]:
    with FakeVertex(project=PROJECT) as fake:
        assert isinstance(fake, FakeVertex)
        yield fake


@pytest.fixture(scope="module")
def accounts(tmp_path_factory: pytest.TempPathFactory, vertex: FakeVertex) -> dict[str, Path]:
    """Key files: one the fake trusts, and one with the same account and a key it never saw."""
    folder = tmp_path_factory.mktemp("accounts")
    trusted, stranger = folder / "trusted.json", folder / "stranger.json"
    vertex.trust(EMAIL, service_account(trusted, vertex.token_uri, PROJECT))
    service_account(stranger, vertex.token_uri, PROJECT)
    return {"trusted": trusted, "stranger": stranger}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, vertex: FakeVertex, backup: FakeUpstream,
            accounts: dict[str, Path]) -> Iterator[GatewayProcess]:
    def on_vertex(models: dict[str, str], credentials: Path | None = accounts["trusted"],
                  **extra: Any) -> dict[str, Any]:
        found = {"credentials": str(credentials), "project": PROJECT} if credentials else {}
        return {"type": "vertex", "location": "us-central1", "base_url": vertex.base_url,
                "models": models, **found, **extra}

    env = {"GOOGLE_APPLICATION_CREDENTIALS": str(accounts["trusted"])}
    yield from started(tmp_path_factory.mktemp("vertex"), {
        "down": provider(refusing_url(), {"to-vertex": "m"}),
        "refused": on_vertex({"refused": "gemini-2.5-flash", "refused-only": "gemini-2.5-flash"},
                             accounts["stranger"]),
        # Whole answers asked whole (generateContent, rawPredict), streams streamed.
        "vertex": on_vertex({"gemini": "gemini-2.5-flash", "claude": CLAUDE,
                             "embed": "text-embedding-005", "to-vertex": "gemini-2.5-flash",
                             "alone": "gemini-2.5-flash"},
                            stream_upstream=False),
        # A project this service account has no access to.
        "elsewhere": on_vertex({"elsewhere": "gemini-2.5-flash"}, project="other-project"),
        "brief": on_vertex({"brief": "gemini-2.5-flash"}),
        # No key file, no project: the environment's credentials, and their project.
        "ambient": on_vertex({"ambient": "gemini-2.5-flash"}, None),
        "backup": provider(backup.base_url, {"gemini": "backup-model", "claude": "backup-model",
                                             "refused": "backup-model",
                                             "elsewhere": "backup-model"}),
    }, env)


@pytest.fixture
def client(gateway: GatewayProcess, vertex: FakeVertex, backup: FakeUpstream) -> openai.OpenAI:
    return fresh_client(gateway, vertex, vertex.anthropic, backup)


def bearer(call: Recorded) -> str:
    """The access token a model call carried."""
    scheme, _, token = call.headers["authorization"].partition(" ")
    assert scheme == "Bearer"
    return token


def token_requests(fake: FakeVertex) -> list[dict[str, list[str]]]:
    """The forms posted to the token endpoint since the last reset."""
    return [parse_qs(r.body.decode()) for r in fake.requests if r.path == "/token"]


def test_a_whole_answer_carries_a_token_minted_for_the_service_account(
        client: openai.OpenAI, vertex: FakeVertex) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="gemini", max_tokens=64, messages=[{"role": "system", "content": "Be brief."}, *HI])
    answer = raw.parse()

    validate(raw.http_response.json(), "CreateChatCompletionResponse")
    assert raw.headers["x-llms-provider"] == "vertex"
    assert answer.choices[0].message.content == "Hello from vertex"
    assert answer.usage is not None and answer.usage.total_tokens == 13
    call = vertex.calls()[-1]
    assert call.path == f"{GEMINI_PATH}/gemini-2.5-flash:generateContent"
    assert call.json == {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                         "systemInstruction": {"parts": [{"text": "Be brief."}]},
                         "generationConfig": {"maxOutputTokens": 64}}
    assert bearer(call) in vertex.tokens_minted()


def test_tool_calls_whole_and_streamed(client: openai.OpenAI, vertex: FakeVertex) -> None:
    vertex.set_mode(tool_call("get_weather", '{"city": "Oslo"}'))
    whole = client.chat.completions.create(model="gemini", tools=[WEATHER],  # type: ignore[list-item]
                                           messages=[{"role": "user", "content": "Oslo?"}])
    with client.chat.completions.stream(model="gemini", tools=[WEATHER],  # type: ignore[list-item]
                                        messages=[{"role": "user", "content": "?"}]) as stream:
        streamed = stream.get_final_completion()

    for answer in (whole, streamed):
        call = answer.choices[0].message.tool_calls[0]  # type: ignore[index]
        assert (call.function.name, json.loads(call.function.arguments)) == \
            ("get_weather", {"city": "Oslo"})
        assert answer.choices[0].finish_reason == "tool_calls"
    assert vertex.calls()[-1].json["tools"] == [{"functionDeclarations": [{
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}]}]


def test_embeddings_go_through_predict_with_vertex_s_token_counts(client: openai.OpenAI,
                                                                 vertex: FakeVertex) -> None:
    raw = client.embeddings.with_raw_response.create(
        model="embed", input=["hello world", "good night moon"], dimensions=4)
    listed = raw.parse()

    validate(raw.http_response.json(), "CreateEmbeddingResponse")
    assert [len(item.embedding) for item in listed.data] == [4, 4]
    assert listed.usage.prompt_tokens == 5  # 2 + 3, as Vertex counted them
    call = vertex.calls()[-1]
    assert call.path == f"{GEMINI_PATH}/text-embedding-005:predict"
    assert call.json == {"instances": [{"content": "hello world"},
                                       {"content": "good night moon"}],
                         "parameters": {"outputDimensionality": 4}}


def test_claude_on_vertex_whole_streamed_and_with_tools(client: openai.OpenAI,
                                                        vertex: FakeVertex) -> None:
    whole = client.chat.completions.create(model="claude", max_tokens=32, messages=HI)
    streamed = list(client.chat.completions.create(model="claude", stream=True, messages=HI))
    vertex.anthropic.set_mode(tool_call("get_weather", '{"city": "Bergen"}'))
    called = client.chat.completions.create(model="claude", tools=[WEATHER],  # type: ignore[list-item]
                                            messages=[{"role": "user", "content": "Bergen?"}])

    assert whole.choices[0].message.content == "Hello from vertex"
    assert whole.usage is not None and (whole.usage.prompt_tokens,
                                        whole.usage.completion_tokens) == (10, 5)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        "Hello from vertex"
    call = called.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"city": "Bergen"}
    first, second, third = vertex.calls()
    assert first.path == f"{CLAUDE_PATH}/{CLAUDE}:rawPredict"
    assert second.path == f"{CLAUDE_PATH}/{CLAUDE}:streamRawPredict"
    assert first.json == {"anthropic_version": "vertex-2023-10-16", "max_tokens": 32,
                          "stream": False,
                          "messages": [{"role": "user", "content": [{"type": "text",
                                                                     "text": "Hi"}]}]}
    assert second.json["stream"] is True and "model" not in second.json
    assert third.json["tools"][0]["name"] == "get_weather"
    assert {bearer(c) for c in (first, second, third)} <= set(vertex.tokens_minted())


def test_images_and_reasoning_reach_gemini_and_thoughts_come_back(client: openai.OpenAI,
                                                                  vertex: FakeVertex) -> None:
    vertex.set_mode(ok(reasoning="Let me look.", content="A cat."))

    answer = client.chat.completions.create(model="gemini", reasoning_effort="low", messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": PIXEL}}]}])

    assert answer.choices[0].message.content == "A cat."
    assert (answer.choices[0].message.model_extra or {})["reasoning"] == "Let me look."
    sent = vertex.calls()[-1].json
    assert sent["contents"][0]["parts"][1] == {"inlineData": {"mimeType": "image/png",
                                                              "data": "iVBORw0KGgo="}}
    assert sent["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 1024,
                                                          "includeThoughts": True}


def test_the_messages_and_responses_apis_reach_vertex_through_the_bridges(
        client: openai.OpenAI, gateway: GatewayProcess, vertex: FakeVertex) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
        message = sdk.messages.create(model="claude", max_tokens=64, messages=[
            {"role": "user", "content": "Hi"}])
    response = client.responses.create(model="gemini", input="Hi")

    assert message.content[0].text == "Hello from vertex"  # type: ignore[union-attr]
    assert response.output_text == "Hello from vertex"
    assert [c.path.rsplit(":", 1)[-1] for c in vertex.calls()] == ["rawPredict",
                                                                   "generateContent"]


@pytest.mark.parametrize(("code", "stream"), [(429, False), (503, True), (403, False)])
def test_an_exhausted_unavailable_or_forbidden_vertex_fails_over(
        client: openai.OpenAI, vertex: FakeVertex, code: int, stream: bool) -> None:
    vertex.set_mode(status(code))

    raw = client.chat.completions.with_raw_response.create(model="gemini", messages=HI,
                                                           stream=stream)

    assert raw.headers["x-llms-provider"] == "backup"
    assert len(vertex.calls()) == 1


@pytest.mark.parametrize(("code", "error"), [(429, openai.RateLimitError),
                                           (401, openai.APIStatusError)])
def test_alone_an_exhausted_vertex_is_rate_limited_and_a_refused_token_no_500(
        client: openai.OpenAI, vertex: FakeVertex, code: int, error: type[Exception]) -> None:
    vertex.set_mode(status(code))

    with pytest.raises(error) as caught:
        client.chat.completions.create(model="alone", messages=HI)

    assert isinstance(caught.value, openai.APIStatusError)
    assert caught.value.status_code == (429 if code == 429 else 502)


def test_another_project_s_path_is_refused_by_vertex_and_failed_over(
        client: openai.OpenAI, vertex: FakeVertex) -> None:
    raw = client.chat.completions.with_raw_response.create(model="elsewhere", messages=HI)

    assert raw.headers["x-llms-provider"] == "backup"
    assert vertex.calls()[-1].path.startswith("/v1/projects/other-project/")


def test_a_provider_that_cannot_connect_fails_over_to_vertex(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="to-vertex", messages=HI)

    assert raw.headers["x-llms-provider"] == "vertex"
    assert raw.parse().choices[0].message.content == "Hello from vertex"


def test_a_token_server_refusing_the_assertion_is_an_auth_failure_failed_over(
        client: openai.OpenAI, vertex: FakeVertex, gateway: GatewayProcess) -> None:
    raw = client.chat.completions.with_raw_response.create(model="refused", messages=HI)
    alone = httpx.post(f"{gateway.base_url}/chat/completions",
                       json={"model": "refused-only", "messages": HI}, timeout=30)

    assert raw.headers["x-llms-provider"] == "backup"
    assert vertex.calls() == [], "no model call without a token"
    assert len(token_requests(vertex)) == 2  # asked again by the next request, not cached
    assert alone.status_code == 502, alone.text
    assert "Invalid JWT Signature" in alone.text


def test_without_a_key_file_the_environment_s_credentials_and_project_serve(
        client: openai.OpenAI, vertex: FakeVertex) -> None:
    raw = client.chat.completions.with_raw_response.create(model="ambient", messages=HI)

    assert raw.headers["x-llms-provider"] == "ambient"
    assert vertex.calls()[-1].path.startswith(GEMINI_PATH)
    assert bearer(vertex.calls()[-1]) in vertex.tokens_minted()


def test_a_token_near_its_expiry_is_refreshed_before_it_is_used(client: openai.OpenAI,
                                                                vertex: FakeVertex) -> None:
    vertex.expires_in = 120  # inside google-auth's margin (3 min 45 s): refreshed at next use
    try:
        for _ in range(2):
            client.chat.completions.create(model="brief", messages=HI)
    finally:
        vertex.expires_in = 3600
    client.chat.completions.create(model="brief", messages=HI)
    client.chat.completions.create(model="brief", messages=HI)

    used = [bearer(call) for call in vertex.calls()]
    assert len(set(used[:2])) == 2, "a new token for the second request"
    assert vertex.minted[used[0]] > vertex.now(), "while the first one still lived"
    assert used[2] == used[3], "a token far from its expiry is kept"
    assert len(token_requests(vertex)) == 3


def test_a_reload_keeps_the_token_it_holds(client: openai.OpenAI, vertex: FakeVertex,
                                          gateway: GatewayProcess) -> None:
    client.chat.completions.create(model="gemini", messages=HI)
    held, asked = bearer(vertex.calls()[-1]), len(token_requests(vertex))
    doc = json.loads(gateway.config_path.read_text())
    doc["providers"]["vertex"]["models"]["renamed"] = "gemini-2.5-flash"
    gateway.write_config(doc)
    wait_until(lambda: "renamed" in {m.id for m in client.models.list()})

    client.chat.completions.create(model="renamed", messages=HI)

    assert bearer(vertex.calls()[-1]) == held
    assert len(token_requests(vertex)) == asked, "no new token for a new snapshot"


def test_a_token_vertex_calls_expired_fails_over_and_the_next_request_gets_a_new_one(
        client: openai.OpenAI, vertex: FakeVertex) -> None:
    client.chat.completions.create(model="gemini", messages=HI)
    vertex.advance(7200)  # past the held token's hour, on the fake's clock

    refused = client.chat.completions.with_raw_response.create(model="gemini", messages=HI)
    again = client.chat.completions.with_raw_response.create(model="gemini", messages=HI)

    assert refused.headers["x-llms-provider"] == "backup", "a 401 is failed over"
    assert again.headers["x-llms-provider"] == "vertex"
    tokens = [bearer(call) for call in vertex.calls()]
    assert tokens[0] == tokens[1] != tokens[2]
    assert tokens[2] == vertex.tokens_minted()[-1]


def test_no_access_token_or_private_key_reaches_an_answer_or_a_log(
        client: openai.OpenAI, vertex: FakeVertex, gateway: GatewayProcess,
        accounts: dict[str, Path]) -> None:
    seen = []
    for mode, stream in [(echo_headers(400), False), (echo_headers(500), False),
                         (echo_headers(401), True)]:
        vertex.set_mode(mode)
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                              json={"model": "gemini", "messages": HI, "stream": stream})
        seen.append(f"{response.status_code} {response.headers} {response.text}")
    vertex.set_mode(ok())

    assert "debug: " in seen[0], "the echo reached the client, redacted"
    key = json.loads(accounts["trusted"].read_text())["private_key"]
    secrets = [*vertex.tokens_minted(), *key.splitlines()[1:-1]]
    for text in [*seen, gateway.logs()]:
        assert not [s for s in secrets if s in text], text[:2000]


# -- the parts, without the gateway ---------------------------------------------------------------

def tokens_from(key_file: Path, transport: AiohttpTransport) -> AccessTokens:
    """A provider's tokens, without the provider: google-auth's HTTP through `transport`."""
    async def send(method: str, url: str, body: bytes | None,
                   headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]:
        response = await transport.request(method, url, headers=headers, body=body)
        try:
            return response.status, response.headers, await response.read()
        finally:
            response.close()

    return AccessTokens(service_account_credentials(str(key_file)), send, 10)


def test_one_refresh_serves_every_request_waiting_for_it(vertex: FakeVertex,
                                                        accounts: dict[str, Path]) -> None:
    async def tokens_at_once() -> list[str]:
        async with AiohttpTransport() as transport:
            tokens = tokens_from(accounts["trusted"], transport)
            return await asyncio.gather(*(tokens.token() for _ in range(8)))

    vertex.reset()
    got = asyncio.run(tokens_at_once())

    assert len(set(got)) == 1 and got[0] in vertex.tokens_minted()
    assert len(token_requests(vertex)) == 1


def test_a_refused_refresh_is_a_provider_auth_failure(vertex: FakeVertex,
                                                     accounts: dict[str, Path]) -> None:
    async def refused() -> None:
        async with AiohttpTransport() as transport:
            await tokens_from(accounts["stranger"], transport).token()

    with pytest.raises(ProviderRejected, match="Invalid JWT Signature"):
        asyncio.run(refused())


@pytest.mark.parametrize(("failure", "becomes"), [
    (google.auth.exceptions.RefreshError("invalid_grant: Invalid JWT Signature."),
     ProviderRejected),
    (google.auth.exceptions.DefaultCredentialsError("Your default credentials were not found"),
     ProviderRejected),
    (google.auth.exceptions.RefreshError("internal_failure", retryable=True),
     ProviderUnavailable),
    (google.auth.exceptions.TransportError("cannot connect"), ProviderUnavailable),
])
def test_a_failed_refresh_is_an_auth_failure_or_an_unavailable_token_server(
        failure: google.auth.exceptions.GoogleAuthError, becomes: type[Exception]) -> None:
    error = refresh_error(failure)

    assert type(error) is becomes
    assert str(error).startswith("cannot get an access token: ")


def test_settings_and_key_files_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    assert read_settings({"project": "p", "type": "vertex"}).location == "us-central1"
    with pytest.raises(ValueError, match="location"):
        read_settings({"location": "us-central1.evil.example"})
    with pytest.raises(ValueError, match="project"):
        read_settings({"project": 7})
    with pytest.raises(ValueError, match="cannot read"):
        service_account_credentials(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"type": "service_account"}')
    with pytest.raises(ValueError, match="not a service account key file"):
        service_account_credentials(str(tmp_path / "bad.json"))


def test_urls_name_the_project_location_and_publisher() -> None:
    base = "https://europe-west4-aiplatform.googleapis.com"
    assert model_url(base, "p", "europe-west4", "gemini-2.5-pro", "generateContent") == \
        f"{base}/v1/projects/p/locations/europe-west4/publishers/google/models/" \
        "gemini-2.5-pro:generateContent"
    assert model_url(base, "p", "europe-west4", CLAUDE, "rawPredict").endswith(
        f"/publishers/anthropic/models/{CLAUDE}:rawPredict")


def test_predict_answers_become_an_embedding_list() -> None:
    payload = json.dumps({"predictions": [
        {"embeddings": {"values": [0.5, 0.5], "statistics": {"token_count": 2.0}}},
        {"embeddings": {"values": [1.0, 0.0], "statistics": {"token_count": 3}}}]}).encode()

    listed = from_predict(payload, ["a b", "c d e"], "embed", None)

    assert to_predict({}, ["x"]) == {"instances": [{"content": "x"}]}
    assert [d["embedding"] for d in listed["data"]] == [[0.5, 0.5], [1.0, 0.0]]
    assert listed["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    with pytest.raises(BadUpstreamResponse):
        from_predict(payload, ["only one"], "embed", None)
