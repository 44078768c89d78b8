"""Resume: a stream cut mid-answer is finished by another candidate, in the same answer.

Every story cuts the first upstream at half of a 200-word answer (`stream_cut`); the fakes that
continue are models that know the whole answer and go on from the partial one they are given
(`tests.upstream.continued`): told to by `continue_final_message` (vLLM's), or asked in words
(then repeating a few words, as models do).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from gateway import config as llms_config
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, echo_headers, ok, status, stream_cut, tool_call

WORDS = 200
ANSWER = " ".join(f"w{i}" for i in range(WORDS))
HALF = WORDS // 2
MESSAGES = [{"role": "user", "content": "count for me"}]


class Stack:
    """A gateway resuming alias `resumed` (first, then a vLLM-like provider), `worded` (first,
    then a plain OpenAI-compatible one), `alone` (first only); `plain` does not resume."""

    def __init__(self, gateway: GatewayProcess, first: FakeUpstream, vllm: FakeUpstream,
                 other: FakeUpstream, claude: FakeAnthropic) -> None:
        self.gateway, self.first, self.vllm, self.other = gateway, first, vllm, other
        self.claude = claude

    def stream(self, model: str, **extra: Any) -> tuple[list[str], dict[str, str], str]:
        """The non-empty lines of a streamed answer, its headers, and its request id."""
        rid = uuid.uuid4().hex
        body = {"model": model, "messages": MESSAGES, "stream": True, **extra}
        with httpx.stream("POST", f"{self.gateway.base_url}/chat/completions", json=body,
                          headers={"x-request-id": rid}) as resp:
            assert resp.status_code == 200
            return [line for line in resp.iter_lines() if line], dict(resp.headers), rid

    def logged(self, rid: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = []

        def line() -> bool:
            found[:] = [r for r in self.gateway.log_events("request")
                        if r.get("request_id") == rid]
            return bool(found)

        wait_until(line)
        return found[0]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with FakeUpstream(name="first") as first, FakeUpstream(name="vllm") as vllm, \
            FakeUpstream(name="other") as other, FakeAnthropic(name="claude") as claude:
        doc = config({
            "first": provider(first.base_url, {"resumed": "m", "worded": "m", "alone": "m",
                                               "plain": "m", "prefilled": "m"}),
            "claude": {"type": "anthropic", "base_url": claude.base_url.removesuffix("/v1"),
                       "api_key": "an-key-000000", "models": {"prefilled": "claude-m",
                                                              "claude-first": "claude-m"}},
            "vllm": provider(vllm.base_url, {"resumed": "m", "plain": "m", "claude-first": "m"},
                             continue_final_message=True),
            "other": provider(other.base_url, {"worded": "m"}),
        }, defaults={"circuit": {"enabled": False}},
            models={"resumed": {"resume": True}, "worded": {"resume": True},
                    "prefilled": {"resume": True}, "claude-first": {"resume": True},
                    "alone": {"resume": True, "max_resumes": 2}})
        gateway = GatewayProcess(Path(tmp_path_factory.mktemp("resume")), doc).start()
        yield Stack(gateway, first, vllm, other, claude)
        gateway.stop()


@pytest.fixture
def fresh(stack: Stack) -> Stack:
    for upstream in (stack.first, stack.vllm, stack.other, stack.claude):
        upstream.reset()
    return stack


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines
            if line.startswith("data: ") and line != "data: [DONE]"]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", ()))


def test_a_stream_cut_halfway_is_finished_by_the_next_candidate(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))

    lines, _, rid = fresh.stream("resumed", stream_options={"include_usage": True})

    events = _events(lines)
    assert _text(events) == ANSWER, "the two parts joined, nothing repeated or lost"
    assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
    assert lines[-2] == ": resumed"
    assert {(e["id"], e["created"], e["model"]) for e in events} == {
        (events[0]["id"], events[0]["created"], events[0]["model"])}
    roles = [c["delta"]["role"] for e in events for c in e["choices"] if "role" in c["delta"]]
    assert roles == ["assistant"]
    asked = fresh.vllm.last_json
    assert asked["continue_final_message"] is True and asked["add_generation_prompt"] is False
    assert asked["messages"][:-1] == MESSAGES
    assert asked["messages"][-1] == {"role": "assistant",
                                     "content": " ".join(f"w{i}" for i in range(HALF))}
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == WORDS, "completion tokens of both parts, summed"
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert [c["finish_reason"] for e in events for c in e["choices"]
            if c["finish_reason"]] == ["stop"]
    logged = fresh.logged(rid)
    assert logged["resumed"] == 1 and logged["resumes_failed"] == 0
    assert logged["outcome"] == "completed" and logged["provider"] == "first"
    assert logged["resumed_by"] == "vllm", "and the provider that finished the answer"
    metrics = httpx.get(f"{fresh.gateway.url}/metrics").text
    assert 'llms_resumes_total{model="resumed",result="ok"}' in metrics


def test_a_continuation_asked_in_words_is_trimmed_where_it_repeats(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.other.set_mode(ok(content=ANSWER))

    lines, _, _ = fresh.stream("worded")

    assert _text(_events(lines)) == ANSWER
    asked = fresh.other.last_json
    assert asked["messages"][-2]["role"] == "assistant"
    assert asked["messages"][-1]["role"] == "user" and "cut off" in asked["messages"][-1]["content"]
    assert "continue_final_message" not in asked


def test_an_alias_with_one_provider_is_resumed_by_that_provider(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER),
                         ok(content=ANSWER))

    lines, _, _ = fresh.stream("alone")

    assert _text(_events(lines)) == ANSWER
    assert lines[-2:] == [": resumed", "data: [DONE]"]
    assert len(fresh.first.requests) == 2


def test_a_whole_answer_cut_halfway_is_resumed_and_says_so(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))

    resp = httpx.post(f"{fresh.gateway.base_url}/chat/completions",
                      json={"model": "resumed", "messages": MESSAGES})

    assert resp.status_code == 200
    assert resp.headers["x-llms-resumed"] == "1"
    answer = resp.json()
    assert answer["choices"][0]["message"]["content"] == ANSWER
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == WORDS
    assert fresh.first.requests[0].json["stream"] is True, "asked as a stream, assembled"


def test_a_tool_call_in_progress_is_never_resumed(fresh: Stack) -> None:
    calling = tool_call("get_weather", '{"city": "Paris", "unit": "celsius"}')
    fresh.first.set_mode(replace(calling, kind="cut", after_chunks=2))

    lines, _, _ = fresh.stream("resumed")

    assert "data: [DONE]" not in lines and ": resumed" not in lines
    assert json.loads(lines[-1][6:])["error"]["code"] == "provider_error"
    assert fresh.vllm.requests == []


def test_an_alias_without_resume_ends_with_the_error_as_before(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))

    lines, _, rid = fresh.stream("plain")

    assert "data: [DONE]" not in lines
    assert json.loads(lines[-1][6:])["error"]["code"] == "provider_error"
    assert _text(_events(lines[:-1])) == " ".join(f"w{i}" for i in range(HALF))
    assert fresh.vllm.requests == []
    assert "resumed" not in fresh.logged(rid)


def test_a_resume_that_breaks_too_ends_with_the_error(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(replace(stream_cut(after_chunks=HALF // 2), content=ANSWER))

    lines, _, rid = fresh.stream("resumed")

    assert "data: [DONE]" not in lines and ": resumed" not in lines
    assert json.loads(lines[-1][6:])["error"]["code"] == "provider_error"
    assert ANSWER.startswith(_text(_events(lines[:-1]))), "what was sent is never taken back"
    logged = fresh.logged(rid)
    assert logged["outcome"] == "error" and logged["resumes_failed"] == 1
    metrics = httpx.get(f"{fresh.gateway.url}/metrics").text
    assert 'llms_resumes_total{model="resumed",result="failed"}' in metrics


def test_the_openai_sdk_reads_a_resumed_stream(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))
    client = openai.OpenAI(base_url=fresh.gateway.base_url, api_key="unused", max_retries=0)

    stream = client.chat.completions.create(model="resumed", messages=MESSAGES,  # type: ignore[arg-type]
                                            stream=True)

    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ANSWER


def test_langchain_reads_a_resumed_stream(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))
    chat = ChatOpenAI(model="resumed", base_url=fresh.gateway.base_url, api_key="unused",  # type: ignore[arg-type]
                      max_retries=0)

    assert "".join(str(part.content) for part in chat.stream("count for me")) == ANSWER


def test_the_anthropic_sdk_reads_a_resumed_messages_stream(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))
    client = anthropic.Anthropic(base_url=fresh.gateway.url, api_key="unused", max_retries=0)

    with client.messages.stream(model="resumed", max_tokens=1000,
                                messages=[{"role": "user", "content": "count for me"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()

    assert text == ANSWER
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == WORDS


def test_a_resumed_messages_stream_says_so_before_its_end(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))
    body = {"model": "resumed", "max_tokens": 1000, "stream": True, "messages": MESSAGES}

    with httpx.stream("POST", f"{fresh.gateway.base_url}/messages", json=body) as resp:
        lines = [line for line in resp.iter_lines() if line]

    assert lines.index(": resumed") < lines.index("event: message_stop")
    assert lines.count(": resumed") == 1


def test_an_anthropic_candidate_continues_from_a_prefill(fresh: Stack) -> None:
    # Cut after "w99 ": the trailing space cannot go in the prefill, and is not sent twice.
    spaced = tuple(f"w{i} " for i in range(WORDS))
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), chunks=spaced))
    fresh.claude.set_mode(ok(content=ANSWER))

    lines, _, _ = fresh.stream("prefilled")

    assert _text(_events(lines)) == ANSWER
    prefill = fresh.claude.last_json["messages"][-1]
    assert prefill["role"] == "assistant"
    assert prefill["content"][0]["text"] == " ".join(f"w{i}" for i in range(HALF)), \
        "a prefill without the trailing whitespace Anthropic refuses"


def test_a_responses_stream_is_resumed_below_the_bridge(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))
    client = openai.OpenAI(base_url=fresh.gateway.base_url, api_key="unused", max_retries=0)

    events = list(client.responses.create(model="resumed", input="count for me", stream=True))

    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == ANSWER
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == ANSWER


def test_an_anthropic_stream_that_fails_mid_answer_is_finished_by_the_next(fresh: Stack) -> None:
    # Anthropic reports trouble mid-stream with an `overloaded_error` event (the fake's cut).
    fresh.claude.set_mode(replace(stream_cut(after_chunks=HALF + 1), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER))

    lines, _, _ = fresh.stream("claude-first", stream_options={"include_usage": True})

    events = _events(lines)
    assert _text(events) == ANSWER
    assert lines[-2:] == [": resumed", "data: [DONE]"]
    assert fresh.vllm.last_json["messages"][-1]["content"] == " ".join(
        f"w{i}" for i in range(HALF))
    assert events[-1]["usage"]["completion_tokens"] == WORDS


def test_an_error_event_mid_stream_is_resumed_and_its_secrets_go_nowhere(fresh: Stack) -> None:
    fresh.first.set_mode(echo_headers(at="mid"))  # "Hi", then an error quoting the headers
    fresh.vllm.set_mode(ok(content="Hi there"))

    lines, _, rid = fresh.stream("resumed")

    assert _text(_events(lines)) == "Hi there"
    assert lines[-2:] == [": resumed", "data: [DONE]"]
    assert fresh.logged(rid)["resumed"] == 1
    assert "sk-test-secret-123456" not in fresh.gateway.logs()


def test_max_resumes_lets_a_continuation_that_breaks_be_resumed_again(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF // 2), content=ANSWER),
                         replace(stream_cut(after_chunks=HALF // 2), content=ANSWER),
                         ok(content=ANSWER))

    lines, _, rid = fresh.stream("alone")

    assert _text(_events(lines)) == ANSWER
    assert lines.count(": resumed") == 1 and lines[-1] == "data: [DONE]"
    assert len(fresh.first.requests) == 3
    logged = fresh.logged(rid)
    assert logged["resumed"] == 2 and logged["resumes_failed"] == 0


def test_resume_is_off_unless_an_alias_asks_and_its_bound_is_checked_at_load() -> None:
    text = ('{"providers": {"p": {"type": "openai", "base_url": "http://x/v1", "models": '
            '{"a": "m", "b": "m"}}}, "models": {"a": {"resume": true, "max_resumes": %s}}}')

    snapshot = llms_config.parse(text % 2, Path("llms.json"), {})
    assert (snapshot.policy("a").resume, snapshot.policy("a").max_resumes) == (True, 2)
    assert (snapshot.policy("b").resume, snapshot.policy("b").max_resumes) == (False, 1)
    with pytest.raises(llms_config.ConfigError, match="max_resumes"):
        llms_config.parse(text % 0, Path("llms.json"), {})


def test_a_candidate_refusing_the_continuation_passes_it_to_the_next(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER),
                         ok(content=ANSWER))
    fresh.vllm.set_mode(status(400, "continue_final_message is not supported here"))

    lines, _, _ = fresh.stream("resumed")

    assert _text(_events(lines)) == ANSWER, "the provider that broke, asked last, finished it"
    assert lines[-2:] == [": resumed", "data: [DONE]"]
    assert len(fresh.vllm.requests) == 1 and len(fresh.first.requests) == 2


def test_a_client_leaving_during_the_continuation_cancels_it(fresh: Stack) -> None:
    fresh.first.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.vllm.set_mode(ok(content=ANSWER, delay_between_chunks=0.05))
    body = {"model": "resumed", "messages": MESSAGES, "stream": True}

    with httpx.stream("POST", f"{fresh.gateway.base_url}/chat/completions", json=body) as resp:
        for line in resp.iter_lines():
            if f"w{HALF + 1}" in line:  # the continuation has begun: hang up
                break

    assert fresh.vllm.wait_for_cancel(timeout=5)


@pytest.mark.parametrize(("alias", "breaks", "continues"), [
    ("prefilled", "first", "claude"), ("claude-first", "claude", "vllm")])
def test_a_whole_answer_is_resumed_to_and_from_anthropic(fresh: Stack, alias: str, breaks: str,
                                                         continues: str) -> None:
    # Anthropic's cut is its `overloaded_error` event after the answer's opening events.
    after = HALF + 1 if breaks == "claude" else HALF
    getattr(fresh, breaks).set_mode(replace(stream_cut(after_chunks=after), content=ANSWER))
    getattr(fresh, continues).set_mode(ok(content=ANSWER))

    resp = httpx.post(f"{fresh.gateway.base_url}/chat/completions",
                      json={"model": alias, "messages": MESSAGES})

    assert resp.status_code == 200 and resp.headers["x-llms-resumed"] == "1"
    answer = resp.json()
    assert answer["choices"][0]["message"]["content"] == ANSWER
    # Summed: the fake Anthropic reports 5 output tokens whatever it wrote.
    assert answer["usage"]["completion_tokens"] == (HALF + 5 if continues == "claude" else WORDS)
    assert getattr(fresh, breaks).requests[0].json["stream"] is True, "asked as a stream"
