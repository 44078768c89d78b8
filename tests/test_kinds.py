"""What every provider kind does alike, told once and for each kind: its stream is translated
event by event; a stream its upstream breaks before the first token fails over, one broken
after it ends in an in-band error, never a clean end; the Responses API reaches the kind
through the bridge.

A kind's own ways (its translation, its auth, its errors) are in its own module:
tests/test_anthropic.py, test_google.py, test_vertex.py, test_bedrock.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fake_anthropic import FakeAnthropic
from tests.fake_bedrock import FakeBedrock, exception_event
from tests.fake_gemini import FakeGemini
from tests.fake_vertex import EMAIL, FakeVertex, service_account
from tests.gateway_process import GatewayProcess, provider
from tests.kinds import fresh_client, started
from tests.openapi import validate
from tests.upstream import FakeUpstream, Mode, stream_cut

GOOGLE_KEY = "AIzaSyTest-gemini-key-0123456789abcdef"
PROJECT = "test-project"
NOVA = "amazon.nova-lite-v1:0"
AWS_KEY_ID, AWS_SECRET = "AKIAFAKEBEDROCK00001", "fake/Secret+Key0123456789abcdefGHIJ"
# The environment's AWS keys are the ones the bedrock kind finds; the developer's own AWS
# setup stays out of it.
AWS = {"AWS_ACCESS_KEY_ID": AWS_KEY_ID, "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
       "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
       "AWS_EC2_METADATA_DISABLED": "true"}
KINDS = ("anthropic", "google", "vertex", "bedrock")
HI = [{"role": "user", "content": "Hi"}]


@dataclass(frozen=True)
class Kind:
    """A kind as these stories meet it: the provider `name` (also the alias it serves, the
    backup behind it), its fake and its entry in llms.json; the path its upstream streams
    from and the completion tokens it counts for an answer; how that upstream breaks a stream
    before the first token, and after two chunks with what `error` says."""

    name: str
    fake: FakeUpstream
    entry: dict[str, Any]
    streams_from: str
    completion_tokens: int
    broken_at_once: Mode
    broken_midway: Mode
    error: str

    @property
    def said(self) -> str:
        """What the kind's fake answers."""
        return f"Hello from {self.name}"


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Kind]]:
    account = tmp_path_factory.mktemp("account") / "service-account.json"
    with FakeAnthropic(name="anthropic") as anthropic, \
            FakeGemini(name="google", key=GOOGLE_KEY) as google, \
            FakeVertex(name="vertex", project=PROJECT) as vertex, \
            FakeBedrock(name="bedrock", keys={AWS_KEY_ID: AWS_SECRET}) as bedrock:
        vertex.trust(EMAIL, service_account(account, vertex.token_uri, PROJECT))
        found = [
            Kind("anthropic", anthropic, entry={
                "type": "anthropic", "base_url": anthropic.base_url,
                "api_key": "sk-ant-test-key-0123456789",
                "models": {"anthropic": "claude-sonnet-4-5"}},
                streams_from="/v1/messages", completion_tokens=5,
                broken_at_once=stream_cut(after_chunks=0), broken_midway=stream_cut(),
                error="overloaded_error"),
            Kind("google", google, entry={
                "type": "google", "base_url": google.base_url, "api_key": GOOGLE_KEY,
                "models": {"google": "gemini-2.5-flash"}},
                streams_from="/v1beta/models/gemini-2.5-flash:streamGenerateContent",
                completion_tokens=3, broken_at_once=stream_cut(after_chunks=0),
                broken_midway=stream_cut(after_chunks=2), error="connection lost"),
            Kind("vertex", vertex, entry={
                "type": "vertex", "location": "us-central1", "base_url": vertex.base_url,
                "credentials": str(account), "project": PROJECT,
                "models": {"vertex": "gemini-2.5-flash"}},
                streams_from=f"/v1/projects/{PROJECT}/locations/us-central1/publishers/google"
                             "/models/gemini-2.5-flash:streamGenerateContent",
                completion_tokens=3, broken_at_once=stream_cut(after_chunks=0),
                broken_midway=stream_cut(after_chunks=2), error="connection lost"),
            Kind("bedrock", bedrock, entry={
                "type": "bedrock", "region": "us-east-1", "base_url": bedrock.url,
                "models": {"bedrock": NOVA}},
                streams_from=f"/model/{NOVA}/converse-stream", completion_tokens=3,
                broken_at_once=exception_event("throttlingException", after_chunks=0),
                broken_midway=exception_event("modelStreamErrorException", after_chunks=2),
                error="modelStreamErrorException"),
        ]
        yield {kind.name: kind for kind in found}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, kinds: dict[str, Kind],
            backup: FakeUpstream) -> Iterator[GatewayProcess]:
    yield from started(tmp_path_factory.mktemp("kinds"), {
        **{kind.name: kind.entry for kind in kinds.values()},
        "backup": provider(backup.base_url, {name: "backup-model" for name in kinds}),
    }, AWS)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest, kinds: dict[str, Kind], backup: FakeUpstream) -> Kind:
    chosen = kinds[request.param]
    chosen.fake.reset()
    backup.reset()
    return chosen


def streamed(gateway: GatewayProcess, model: str) -> tuple[httpx.Response, list[str]]:
    """A streamed chat answer from `model`, and its lines that are not empty."""
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": model, "stream": True, "messages": HI}) as answer:
        return answer, [line for line in answer.iter_lines() if line]


def text(lines: list[str]) -> str:
    """The content a stream's chunks carry."""
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines
              if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c.get("choices"))


def test_a_stream_is_translated_event_by_event_with_usage_only_when_asked(
        kind: Kind, gateway: GatewayProcess) -> None:
    chunks = list(fresh_client(gateway).chat.completions.create(
        model=kind.name, stream=True, messages=HI, stream_options={"include_usage": True}))
    _, plain = streamed(gateway, kind.name)

    for chunk in chunks:
        validate(chunk.model_dump(mode="json", exclude_unset=True),
                 "CreateChatCompletionStreamResponse")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == kind.said
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == kind.completion_tokens
    assert not any('"usage"' in line for line in plain), "usage only when the client asked"
    assert plain[-1] == "data: [DONE]"
    assert {r.path for r in kind.fake.requests} - {"/token"} == {kind.streams_from}


def test_a_stream_broken_before_its_first_token_fails_over(kind: Kind,
                                                           gateway: GatewayProcess) -> None:
    kind.fake.set_mode(kind.broken_at_once)

    answer, lines = streamed(gateway, kind.name)

    assert answer.headers["x-llms-provider"] == "backup"
    assert lines[-1] == "data: [DONE]"
    assert text(lines) == "Hello from backup"


def test_a_stream_broken_after_its_first_token_ends_in_an_error_never_a_clean_end(
        kind: Kind, gateway: GatewayProcess) -> None:
    kind.fake.set_mode(kind.broken_midway)

    answer, lines = streamed(gateway, kind.name)

    assert answer.status_code == 200
    assert answer.headers["x-llms-provider"] == kind.name
    assert "[DONE]" not in "".join(lines)
    assert any('"Hello"' in line for line in lines), "what came before the break came"
    assert kind.error in json.loads(lines[-1].removeprefix("data: "))["error"]["message"]


def test_the_responses_api_reaches_the_kind_through_the_bridge(
        kind: Kind, gateway: GatewayProcess) -> None:
    response = fresh_client(gateway).responses.create(model=kind.name, input="Hi",
                                                      instructions="Be brief.")

    assert response.output_text == kind.said
