"""The semantic cache: a question asked again in other words is answered from the cache, never
across tenants, never for another system prompt or tool list, and never by a guess the embedding
did not earn.

Two fake upstreams: `chat` answers the alias `faq`, `embed` serves the embedding alias `meaning`
with a fake embedding under which paraphrases are close ("What is the capital of France?" and
"what's France's capital city": 0.8165; "... of Germany?": 0.5). The chat fake's request log
says which questions reached it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.test_teams import Admin, keyed_everywhere
from tests.upstream import FakeUpstream, hang, ok, status, tool_call

FRANCE = "What is the capital of France?"
PARAPHRASE = "what's France's capital city"
GERMANY = "What is the capital of Germany?"
ALICE, BOB = "alice-key-00001", "bob-key-000001"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def chat_up() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="chat") as fake:
        yield fake


@pytest.fixture(scope="module")
def embed_up() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="embed", paraphrases=True) as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh(chat_up: FakeUpstream, embed_up: FakeUpstream) -> None:
    chat_up.reset()
    embed_up.reset()


def semantic_config(chat_up: FakeUpstream, embed_up: FakeUpstream, scope: str = "key",
                    **sections: Any) -> dict[str, Any]:
    semantic = {"embedding_alias": "meaning", "threshold": 0.8, "ttl": 600, "timeout": 2}
    return config({"chat": provider(chat_up.base_url, {"faq": "m", "plain": "m"}),
                   "embed": provider(embed_up.base_url, {"meaning": "embedder"})},
                  models={"faq": {"cache": {"semantic": semantic, "scope": scope}}}, **sections)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, chat_up: FakeUpstream,
            embed_up: FakeUpstream) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("semantic"),
                             semantic_config(chat_up, embed_up)).start()
    yield process
    process.stop()


def client(gateway: GatewayProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=20)


def ask(gateway: GatewayProcess, question: str, key: str = "unused",
        system: str | None = None, **extra: Any) -> tuple[str | None, httpx.Headers]:
    """The answer's text and headers, as the OpenAI SDK gets them."""
    messages = [{"role": "system", "content": system}] if system else []
    raw = client(gateway, key).chat.completions.with_raw_response.create(
        model=extra.pop("model", "faq"),
        messages=[*messages, {"role": "user", "content": question}], **extra)
    return raw.parse().choices[0].message.content, raw.headers


def asked_upstream(chat_up: FakeUpstream) -> list[str]:
    """The last user turn of every chat request that reached the chat upstream."""
    return [r.json["messages"][-1]["content"] for r in chat_up.requests
            if r.path == "/v1/chat/completions"]


def test_a_paraphrase_is_answered_from_the_cache_without_reaching_the_upstream(
        gateway: GatewayProcess, chat_up: FakeUpstream, embed_up: FakeUpstream) -> None:
    chat_up.set_mode(ok("Paris."))
    first, first_headers = ask(gateway, FRANCE)
    again, headers = ask(gateway, PARAPHRASE)

    assert first == again == "Paris."
    assert "x-llms-cache" not in first_headers
    assert headers["x-llms-cache"] == "semantic"
    assert headers["x-llms-cache-similarity"] == "0.8165"
    assert headers["x-llms-provider"] == "chat"
    assert asked_upstream(chat_up) == [FRANCE]
    assert len(embed_up.requests) == 2, "each question was embedded once"


def test_a_paraphrase_streams_from_a_kept_stream_and_a_whole_request_reads_it_too(
        gateway: GatewayProcess, chat_up: FakeUpstream) -> None:
    chat_up.set_mode(ok("Rome, since 1871."))

    def streamed(question: str) -> tuple[str, httpx.Headers]:
        with client(gateway).chat.completions.with_streaming_response.create(
                model="faq", messages=[{"role": "user", "content": question}],
                stream=True, stream_options={"include_usage": True}) as raw:
            chunks = list(raw.parse())
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert chunks[-1].usage is not None
            return text, raw.headers

    first, _ = streamed("What is the capital of Italy?")
    again, headers = streamed("Tell me Italy's capital city")
    whole, whole_headers = ask(gateway, "italy capital")

    assert first == again == whole == "Rome, since 1871."
    assert headers["x-llms-cache"] == whole_headers["x-llms-cache"] == "semantic"
    assert headers["content-type"].startswith("text/event-stream")
    assert float(headers["x-llms-cache-similarity"]) >= 0.8
    assert asked_upstream(chat_up) == ["What is the capital of Italy?"]


def test_a_different_question_is_never_served_another_answer(
        gateway: GatewayProcess, chat_up: FakeUpstream) -> None:
    chat_up.set_mode(ok("Madrid."), ok("Lisbon."), ok("8,849 metres."))
    ask(gateway, "What is the capital of Spain?")
    other, headers = ask(gateway, "What is the capital of Portugal?")
    tall, _ = ask(gateway, "How tall is Everest?")

    assert (other, tall) == ("Lisbon.", "8,849 metres.")
    assert "x-llms-cache" not in headers
    assert len(asked_upstream(chat_up)) == 3


def test_another_system_prompt_or_tool_list_is_never_served_and_the_same_tools_are(
        gateway: GatewayProcess, chat_up: FakeUpstream) -> None:
    chat_up.set_mode(ok("Ottawa."))
    ask(gateway, "What is the capital of Canada?", system="Answer briefly.", tools=TOOLS)
    _, pirate = ask(gateway, "Canada's capital city", system="Answer as a pirate.",
                    tools=TOOLS)
    _, toolless = ask(gateway, "Canada's capital city", system="Answer briefly.")
    other_tools = [{"type": "function", "function": {"name": "search",
                                                     "parameters": {"type": "object"}}}]
    _, retooled = ask(gateway, "Canada's capital city", system="Answer briefly.",
                      tools=other_tools)
    _, same = ask(gateway, "Canada's capital city", system="Answer briefly.", tools=TOOLS)

    for missed in (pirate, toolless, retooled):
        assert "x-llms-cache" not in missed
    assert same["x-llms-cache"] == "semantic"
    assert len(asked_upstream(chat_up)) == 4


def test_answers_calling_tools_and_hot_or_multiple_samples_are_not_kept(
        gateway: GatewayProcess, chat_up: FakeUpstream) -> None:
    chat_up.set_mode(tool_call("lookup", '{"q": "weather"}'))
    ask(gateway, "What is the weather in Oslo?", tools=TOOLS)
    ask(gateway, "Oslo weather", tools=TOOLS)
    chat_up.set_mode(ok("Warm."))
    ask(gateway, "What is the weather in Cairo?", temperature=1.5)
    _, hot = ask(gateway, "Cairo weather", temperature=1.5)
    ask(gateway, "What is the weather in Lima?", n=2)
    _, several = ask(gateway, "Lima weather", n=2)

    assert "x-llms-cache" not in hot and "x-llms-cache" not in several
    assert len(asked_upstream(chat_up)) == 6


def test_an_embedding_alias_down_is_a_miss_and_the_question_is_still_answered(
        gateway: GatewayProcess, chat_up: FakeUpstream, embed_up: FakeUpstream) -> None:
    chat_up.set_mode(ok("Canberra."))
    embed_up.set_mode(status(503))
    answer, headers = ask(gateway, "What is the capital of Australia?")
    again, again_headers = ask(gateway, "Australia's capital city")

    assert answer == again == "Canberra."
    assert "x-llms-cache" not in headers and "x-llms-cache" not in again_headers
    assert len(asked_upstream(chat_up)) == 2
    embed_up.set_mode(ok())
    ask(gateway, "What is the capital of Australia?")
    assert ask(gateway, "Australia's capital city")[1]["x-llms-cache"] == "semantic"


def test_an_embedding_alias_that_never_answers_is_a_miss_once_its_timeout_passes(
        gateway: GatewayProcess, chat_up: FakeUpstream, embed_up: FakeUpstream) -> None:
    chat_up.set_mode(ok("Wellington."))
    embed_up.set_mode(hang())
    answer, headers = ask(gateway, "What is the capital of New Zealand?")

    assert answer == "Wellington." and "x-llms-cache" not in headers
    assert len(asked_upstream(chat_up)) == 1


def test_an_alias_without_a_semantic_cache_is_never_served_from_it(
        gateway: GatewayProcess, chat_up: FakeUpstream, embed_up: FakeUpstream) -> None:
    ask(gateway, FRANCE, model="plain")
    _, headers = ask(gateway, PARAPHRASE, model="plain")

    assert "x-llms-cache" not in headers
    assert len(asked_upstream(chat_up)) == 2 and not embed_up.requests


def test_under_key_scope_one_key_is_never_served_another_keys_answer(
        start_gateway: Callable[..., GatewayProcess], chat_up: FakeUpstream,
        embed_up: FakeUpstream) -> None:
    gateway = start_gateway(semantic_config(chat_up, embed_up,
                                            server={"api_keys": [ALICE, BOB]}))
    chat_up.set_mode(ok("Alice's answer."), ok("Bob's answer."))
    ask(gateway, FRANCE, key=ALICE)
    bobs, bob_headers = ask(gateway, PARAPHRASE, key=BOB)
    alices, alice_headers = ask(gateway, PARAPHRASE, key=ALICE)

    assert bobs == "Bob's answer." and "x-llms-cache" not in bob_headers
    assert alices == "Alice's answer." and alice_headers["x-llms-cache"] == "semantic"
    assert len(asked_upstream(chat_up)) == 2


def test_under_team_scope_keys_of_one_team_share_and_another_team_does_not(
        start_gateway: Callable[..., GatewayProcess], chat_up: FakeUpstream,
        embed_up: FakeUpstream) -> None:
    gateway = start_gateway(semantic_config(chat_up, embed_up, scope="team"))
    admin = Admin(gateway)
    admin.team(name="research")
    admin.team(name="sales")
    first, second = (admin.key(name=n, team="research")["key"] for n in ("a", "b"))
    outsider = admin.key(name="c", team="sales")["key"]
    keyed_everywhere(gateway)
    chat_up.set_mode(ok("Research's answer."), ok("Sales' answer."))

    ask(gateway, FRANCE, key=first)
    shared, shared_headers = ask(gateway, PARAPHRASE, key=second)
    theirs, their_headers = ask(gateway, PARAPHRASE, key=outsider)

    assert shared == "Research's answer." and shared_headers["x-llms-cache"] == "semantic"
    assert theirs == "Sales' answer." and "x-llms-cache" not in their_headers
    assert len(asked_upstream(chat_up)) == 2


def test_entries_are_bounded_the_least_recently_used_out_first(
        start_gateway: Callable[..., GatewayProcess], chat_up: FakeUpstream,
        embed_up: FakeUpstream) -> None:
    gateway = start_gateway(semantic_config(chat_up, embed_up,
                                            defaults={"cache": {"max_entries": 2}}))
    for country in ("France", "Spain", "Italy"):
        ask(gateway, f"What is the capital of {country}?")
    _, oldest = ask(gateway, "France's capital city")
    _, newest = ask(gateway, "Italy's capital city")

    assert "x-llms-cache" not in oldest, "the first entry was pushed out by the third"
    assert newest["x-llms-cache"] == "semantic"
    assert len(asked_upstream(chat_up)) == 4


@pytest.mark.skipif(not RedisServer.available(), reason="redis-server is not installed")
def test_two_gateways_on_one_redis_share_entries(
        tmp_path: Path, chat_up: FakeUpstream, embed_up: FakeUpstream) -> None:
    redis = RedisServer().start()
    doc = semantic_config(chat_up, embed_up, state={"backend": "redis", "url": redis.url})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = GatewayProcess(tmp_path / "one", doc).start()
    two = GatewayProcess(tmp_path / "two", doc).start()
    try:
        chat_up.set_mode(ok("Paris."))
        ask(one, FRANCE)
        answer, headers = ask(two, PARAPHRASE)
        assert answer == "Paris." and headers["x-llms-cache"] == "semantic"
        assert asked_upstream(chat_up) == [FRANCE]
    finally:
        one.stop()
        two.stop()
        redis.stop()
