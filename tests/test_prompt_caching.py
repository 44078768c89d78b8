"""Anthropic's prompt caching through the gateway: `cache_control` marks sent in OpenAI's chat
shape (or Anthropic's own, on `/v1/messages`) reach Claude on Anthropic, Bedrock and Vertex AI,
Bedrock's Converse gets `cachePoint`s, and what the cache read and wrote comes back in the
answer's usage and in its cost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import msgspec
import openai
import pytest

from providers.contract.usage import Price, Usage, cost
from providers.kinds.anthropic_request import MAX_BREAKPOINTS, to_messages
from providers.kinds.bedrock_converse import to_converse
from tests.fake_anthropic import FakeAnthropic
from tests.fake_bedrock import FakeBedrock
from tests.fake_vertex import EMAIL, FakeVertex, service_account
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
# Dollars per million tokens, large enough to show in x-llms-cost's six decimals.
PRICE = {"input": 1000.0, "output": 2000.0, "cached_input": 100.0, "cache_write": 1250.0}
KEY_ID, SECRET = "AKIAFAKEBEDROCK00009", "fake/Secret+Key0123456789abcdefCACHE"
NOVA, BEDROCK_CLAUDE = "amazon.nova-lite-v1:0", "anthropic.claude-sonnet-4-5-20250929-v1:0"
LLAMA = "meta.llama3-70b-instruct-v1:0"
VERTEX_CLAUDE = "claude-sonnet-4-5@20250929"
PROJECT = "cache-project"
MANUAL = " ".join(f"rule-{n}" for n in range(300))  # a long, stable system prompt
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with FakeAnthropic(name="claude") as claude, FakeUpstream(name="gpt") as gpt, \
            FakeBedrock(keys={KEY_ID: SECRET}) as bedrock, \
            FakeVertex(project=PROJECT) as vertex:
        key_file = tmp_path_factory.mktemp("account") / "vertex.json"
        vertex.trust(EMAIL, service_account(key_file, vertex.token_uri, PROJECT))
        yield {"claude": claude, "gpt": gpt, "bedrock": bedrock, "vertex": vertex,
               "key_file": key_file}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, Any]) -> Iterator[GatewayProcess]:
    def claude(**extra: Any) -> dict[str, Any]:
        return {"type": "anthropic", "base_url": fakes["claude"].base_url,
                "api_key": "sk-ant-cache-key-000000", **extra}

    doc = config({
        "anthropic": claude(models={"claude": {"id": "claude-sonnet-4-5", "price": PRICE}}),
        "anthropic-whole": claude(stream_upstream=False, models={
            "claude-whole": {"id": "claude-sonnet-4-5", "price": PRICE}}),
        "bedrock": {"type": "bedrock", "region": "us-east-1", "base_url": fakes["bedrock"].url,
                    "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
                    "models": {"bedrock-claude": BEDROCK_CLAUDE, "nova": NOVA,
                               "llama": LLAMA}},
        "vertex": {"type": "vertex", "project": PROJECT, "location": "us-central1",
                   "base_url": fakes["vertex"].base_url, "credentials": str(fakes["key_file"]),
                   "models": {"vertex-claude": VERTEX_CLAUDE}},
        "gpt": provider(fakes["gpt"].base_url, {"gpt": "gpt-upstream"}),
    }, defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("caching"), doc).start()
    yield process
    process.stop()


@pytest.fixture
def client(gateway: GatewayProcess, fakes: dict[str, Any]) -> Iterator[openai.OpenAI]:
    for name in ("claude", "gpt", "bedrock", "vertex"):
        fakes[name].reset()
    fakes["vertex"].anthropic.reset()
    with openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def cached_chat(question: str = "What is rule 7?") -> list[dict[str, Any]]:
    """A conversation marked as LiteLLM's users mark it: a system part, a whole message."""
    return [{"role": "system", "content": [{"type": "text", "text": MANUAL,
                                            "cache_control": EPHEMERAL}]},
            {"role": "user", "content": "Remember the manual.", "cache_control": EPHEMERAL},
            {"role": "assistant", "content": "I will."},
            {"role": "user", "content": question}]


def usage_and_cost(client: openai.OpenAI, model: str = "claude",
                   **extra: Any) -> tuple[dict[str, Any], float]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=cached_chat(), **extra)  # type: ignore[arg-type]
    return json.loads(raw.text)["usage"], float(raw.headers.get("x-llms-cost", "0"))


def last_body(fake: FakeUpstream) -> dict[str, Any]:
    """The last JSON body a fake received (Vertex's token requests are forms)."""
    found: dict[str, Any] = [r.json for r in fake.requests if isinstance(r.json, dict)][-1]
    return found


def priced(usage: dict[str, Any]) -> float:
    """The cost `usage` has at PRICE: reads at `cached_input`, writes at `cache_write`."""
    details = usage["prompt_tokens_details"]
    read, written = details["cached_tokens"], details.get("cache_write_tokens", 0)
    fresh = usage["prompt_tokens"] - read - written
    return (fresh * PRICE["input"] + read * PRICE["cached_input"]
            + written * PRICE["cache_write"] + usage["completion_tokens"] * PRICE["output"]) / 1e6


# -- the OpenAI SDK to Claude -----------------------------------------------------------------


def test_cache_marks_reach_claude_on_the_blocks_they_mark(client: openai.OpenAI,
                                                          fakes: dict[str, Any]) -> None:
    client.chat.completions.create(model="claude", messages=cached_chat(),  # type: ignore[arg-type]
                                   tools=[{**WEATHER, "cache_control": HOUR}])  # type: ignore[list-item]

    sent = fakes["claude"].last_json
    assert sent["tools"][0]["cache_control"] == HOUR
    assert sent["system"] == [{"type": "text", "text": MANUAL, "cache_control": EPHEMERAL}]
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "Remember the manual.", "cache_control": EPHEMERAL}], \
        "a message's mark goes on its last block"
    assert all("cache_control" not in block for message in sent["messages"][1:]
               for block in message["content"])


def test_the_second_call_reads_what_the_first_wrote_and_costs_less(
        client: openai.OpenAI) -> None:
    first, first_cost = usage_and_cost(client)
    second, second_cost = usage_and_cost(client)

    written = first["prompt_tokens_details"]["cache_write_tokens"]
    assert written > 300 and first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == written
    assert "cache_write_tokens" not in second["prompt_tokens_details"]
    assert first["prompt_tokens"] == second["prompt_tokens"], \
        "prompt tokens count every token of the prompt, cached or not (as OpenAI counts)"
    assert first["total_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    assert first_cost == pytest.approx(priced(first), abs=1e-6)
    assert second_cost == pytest.approx(priced(second), abs=1e-6)
    assert second_cost < first_cost / 5


def test_a_whole_answer_asked_whole_reads_the_cache_too(client: openai.OpenAI,
                                                         fakes: dict[str, Any]) -> None:
    usage_and_cost(client, "claude-whole")
    usage, dollars = usage_and_cost(client, "claude-whole")

    assert "stream" not in fakes["claude"].last_json
    assert usage["prompt_tokens_details"]["cached_tokens"] > 300
    assert dollars == pytest.approx(priced(usage), abs=1e-6)


def test_a_stream_reports_the_cache_in_its_usage_chunk(client: openai.OpenAI) -> None:
    usage_and_cost(client)
    stream = client.chat.completions.create(model="claude", messages=cached_chat(),  # type: ignore[arg-type]
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)

    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 300
    assert usage.prompt_tokens > usage.prompt_tokens_details.cached_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) \
        == "Hello from claude"


def test_past_four_breakpoints_only_the_last_four_reach_claude(client: openai.OpenAI,
                                                               fakes: dict[str, Any]) -> None:
    chat = [{"role": "system", "content": "Be brief.", "cache_control": EPHEMERAL},
            *({"role": role, "content": f"turn {n}", "cache_control": EPHEMERAL}
              for n, role in enumerate(["user", "assistant", "user", "assistant", "user"]))]
    answer = client.chat.completions.create(model="claude", messages=chat,  # type: ignore[arg-type]
                                            tools=[{**WEATHER, "cache_control": EPHEMERAL}])  # type: ignore[list-item]

    assert answer.choices[0].message.content == "Hello from claude", "not refused"
    sent = fakes["claude"].last_json
    marked = [block["text"] for message in sent["messages"] for block in message["content"]
              if "cache_control" in block]
    assert marked == ["turn 1", "turn 2", "turn 3", "turn 4"]
    assert "cache_control" not in sent["tools"][0]
    assert sent["system"] == [{"type": "text", "text": "Be brief."}], \
        "the earliest marks are the ones dropped"


# -- Anthropic's SDK on /v1/messages ------------------------------------------------------------


def messages_body(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 64,
            "system": [{"type": "text", "text": MANUAL, "cache_control": EPHEMERAL}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"},
                       "cache_control": EPHEMERAL}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Remember the manual.", "cache_control": EPHEMERAL},
                {"type": "text", "text": "What is rule 7?"}]}]}


def test_the_anthropic_sdk_reads_the_cache_through_the_native_route(
        gateway: GatewayProcess, client: openai.OpenAI, fakes: dict[str, Any]) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
        body = messages_body("claude")
        first = sdk.messages.create(**body)
        second = sdk.messages.create(**body)
        with sdk.messages.stream(**body) as stream:
            streamed = stream.get_final_message()

    assert fakes["claude"].last_json["system"] == body["system"]
    assert first.usage.cache_creation_input_tokens and not first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert streamed.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens


@pytest.mark.parametrize(("model", "fake"), [("bedrock-claude", "bedrock"),
                                             ("vertex-claude", "vertex")])
def test_messages_to_claude_on_bedrock_and_vertex_keep_their_marks(
        gateway: GatewayProcess, client: openai.OpenAI, fakes: dict[str, Any], model: str,
        fake: str) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
        body = messages_body(model)
        sdk.messages.create(**body)
        answer = sdk.messages.create(**body)

    sent = last_body(fakes[fake])
    assert sent["system"] == body["system"]
    assert sent["tools"][0]["cache_control"] == EPHEMERAL
    assert sent["messages"][0]["content"][0]["cache_control"] == EPHEMERAL
    assert "cache_control" not in sent["messages"][0]["content"][1]
    assert answer.usage.cache_read_input_tokens and answer.usage.cache_read_input_tokens > 300


def test_messages_to_a_chat_provider_leave_the_marks_out(
        gateway: GatewayProcess, client: openai.OpenAI, fakes: dict[str, Any]) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as sdk:
        sdk.messages.create(**messages_body("gpt"))

    assert "cache_control" not in json.dumps(fakes["gpt"].last_json), \
        "an upstream that does not know them may refuse them"


# -- Bedrock and Vertex through the OpenAI SDK -------------------------------------------------


def test_claude_on_vertex_reads_the_cache_and_reports_it(client: openai.OpenAI,
                                                         fakes: dict[str, Any]) -> None:
    usage_and_cost(client, "vertex-claude")
    answer = client.chat.completions.create(model="vertex-claude", messages=cached_chat(),  # type: ignore[arg-type]
                                            stream=True, stream_options={"include_usage": True})
    usage = list(answer)[-1].usage

    sent = last_body(fakes["vertex"])
    assert sent["system"][0]["cache_control"] == EPHEMERAL
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 300


def test_nova_on_bedrock_gets_cache_points_and_reports_reads(client: openai.OpenAI,
                                                             fakes: dict[str, Any]) -> None:
    first, _ = usage_and_cost(client, "nova", tools=[{**WEATHER, "cache_control": EPHEMERAL}])
    stream = client.chat.completions.create(
        model="nova", messages=cached_chat(), stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
        tools=[{**WEATHER, "cache_control": EPHEMERAL}])  # type: ignore[list-item]
    usage = list(stream)[-1].usage

    sent = fakes["bedrock"].last_json
    assert sent["system"] == [{"text": MANUAL}, {"cachePoint": {"type": "default"}}]
    assert sent["messages"][0]["content"] == [{"text": "Remember the manual."},
                                              {"cachePoint": {"type": "default"}}]
    assert sent["toolConfig"]["tools"][1] == {"cachePoint": {"type": "default"}}
    assert first["prompt_tokens_details"]["cache_write_tokens"] > 300
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens \
        == first["prompt_tokens_details"]["cache_write_tokens"]


def test_claude_on_bedrock_whole_answer_reads_the_cache(client: openai.OpenAI,
                                                        fakes: dict[str, Any]) -> None:
    usage_and_cost(client, "bedrock-claude")
    usage, _ = usage_and_cost(client, "bedrock-claude")

    assert fakes["bedrock"].last_json["system"][0]["cache_control"] == EPHEMERAL
    assert usage["prompt_tokens_details"]["cached_tokens"] > 300


def test_a_model_without_prompt_caching_gets_no_cache_points(client: openai.OpenAI,
                                                             fakes: dict[str, Any]) -> None:
    answer = client.chat.completions.create(model="llama", messages=cached_chat())  # type: ignore[arg-type]

    assert answer.choices[0].message.content
    assert "cachePoint" not in json.dumps(fakes["bedrock"].last_json)


# -- the translations and the price, without sockets --------------------------------------------


def test_a_tool_result_and_an_image_part_carry_their_marks() -> None:
    body = {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64,iVBORw0KGgo="}, "cache_control": EPHEMERAL}]},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny",
         "cache_control": EPHEMERAL}]}

    sent = to_messages(body, "claude")["messages"]
    assert sent[0]["content"][0]["cache_control"] == EPHEMERAL
    assert sent[2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1",
                                   "content": "sunny", "cache_control": EPHEMERAL}]
    converse = to_converse(body, cache_points=True)["messages"]
    assert converse[2]["content"][-1] == {"cachePoint": {"type": "default"}}


def test_converse_keeps_at_most_four_cache_points_the_latest() -> None:
    chat = [{"role": role, "content": f"turn {n}", "cache_control": EPHEMERAL}
            for n, role in enumerate(["user", "assistant"] * 3)]
    sent = to_converse({"messages": chat}, cache_points=True)["messages"]
    pointed = [m["content"][0]["text"] for m in sent if {"cachePoint": {"type": "default"}}
               in m["content"]]
    assert len(pointed) == MAX_BREAKPOINTS and pointed[-1] == "turn 5"


@pytest.mark.parametrize(("price", "expected"), [
    (Price(input=1, output=2), (100 * 1 + 10 * 2) / 1e6),
    (Price(input=1, output=2, cached_input=0.1), (40 * 1 + 60 * 0.1 + 10 * 2) / 1e6),
    (Price(input=1, output=2, cached_input=0.1, cache_write=1.25),
     (20 * 1 + 60 * 0.1 + 20 * 1.25 + 10 * 2) / 1e6),
])
def test_cache_reads_and_writes_are_priced_at_their_own_rates(price: Price,
                                                             expected: float) -> None:
    usage = msgspec.convert({"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
                             "prompt_tokens_details": {"cached_tokens": 60,
                                                       "cache_write_tokens": 20}}, Usage)
    assert cost(usage, price) == pytest.approx(expected)
