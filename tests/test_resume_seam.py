"""The seam of a resumed stream, pure: continuations per dialect, overlap, usage, rewriting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway import config as llms_config
from gateway.adapters.seam import INSTRUCTION, RESUMED, Stitched, continuation, overlap, whole_usage
from providers import load_kinds
from providers.contract.usage import Usage
from providers.kinds.anthropic_request import to_messages
from providers.kinds.google_request import to_gemini
from providers.wire import sse

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 100, "n": 1}


@pytest.mark.parametrize(("dialect", "tail", "extra"), [
    ("prefill", [{"role": "assistant", "content": "It was"}], {}),
    ("continue_final_message", [{"role": "assistant", "content": "It was "}],
     {"continue_final_message": True, "add_generation_prompt": False}),
    ("instruction", [{"role": "assistant", "content": "It was "},
                     {"role": "user", "content": INSTRUCTION}], {}),
])
def test_each_dialect_asks_for_the_rest(dialect: str, tail: list[dict[str, str]],
                                        extra: dict[str, Any]) -> None:
    asked = continuation(BODY, "It was ", dialect, tokens_sent=30)

    assert asked["messages"] == [*BODY["messages"], *tail]
    assert asked["max_tokens"] == 70, "the budget less what was sent"
    assert "n" not in asked
    assert {k: asked[k] for k in extra} == extra
    assert BODY["messages"] == [{"role": "user", "content": "hi"}], "the client's body is kept"


def test_nothing_sent_yet_asks_the_request_again() -> None:
    assert continuation(BODY, " ", "prefill", 0)["messages"] == BODY["messages"]


@pytest.mark.parametrize(("sent", "incoming", "dropped", "cut"), [
    ("the quick brown", " fox jumps", "", 0),  # a prefill continued exactly
    ("the quick brown ", " fox", " ", 1),  # the whitespace the prefill dropped
    ("jumps over the lazy dog", "the lazy dog, then", "", 12),  # words repeated
    ("ends with ab", "abc", "", 0),  # too short to be a repeat: kept
])
def test_overlap(sent: str, incoming: str, dropped: str, cut: int) -> None:
    assert overlap(sent, incoming, dropped) == cut


def test_whole_usage_counts_the_prompt_once_and_sums_completions() -> None:
    rest = Usage(prompt_tokens=150, completion_tokens=40)

    assert whole_usage(None, 100, rest) == {"prompt_tokens": 50, "completion_tokens": 140,
                                           "total_tokens": 190}
    reported = Usage(prompt_tokens=48, completion_tokens=101)
    assert whole_usage(reported, 100, rest)["prompt_tokens"] == 48
    assert whole_usage(reported, 100, rest)["completion_tokens"] == 141


def _chunk(content: str | None = None, finish: str | None = None, cid: str = "a",
           **delta: Any) -> bytes:
    if content is not None:
        delta["content"] = content
    return sse.encode(json.dumps({"id": cid, "created": 7, "model": cid, "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}).encode())


def test_the_first_stream_passes_as_it_came_and_a_break_is_not_sent() -> None:
    stitched = Stitched()
    first = _chunk("", role="assistant") + _chunk("Hello") + _chunk(" there")

    assert stitched.take(first) == (first, None)
    out, broke = stitched.take(_chunk(" you") + b'data: {"error": {"message": "boom"}}\n\n')

    assert out == _chunk(" you") and broke is not None and "boom" in broke.reason
    assert stitched.text == "Hello there you" and stitched.tokens == 3


def test_an_answer_longer_than_any_prefill_is_relayed_but_no_longer_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.adapters.seam.MAX_PARTIAL_CHARS", 10)
    stitched = Stitched()
    first = _chunk("", role="assistant") + _chunk("Hello") + _chunk(" there, you")

    assert stitched.take(first) == (first, None), "the client still gets every event"
    assert stitched.overflowed and stitched.text == "", "nothing held past the bound"


def test_a_continuation_takes_the_first_identity_and_loses_its_repeat() -> None:
    stitched = Stitched()
    stitched.take(_chunk("", role="assistant") + _chunk("one two three four five"))
    stitched.resumed("")

    out, _ = stitched.take(_chunk("", cid="b", role="assistant") + _chunk(" three four five",
                                                                          cid="b")
                           + _chunk(" six", cid="b") + _chunk(finish="stop", cid="b"))
    out += stitched.take(sse.encode(sse.DONE))[0]

    events = [e.data for e in sse.Reader().feed(out)]
    chunks = [json.loads(d) for d in events if d != sse.DONE]
    assert {(c["id"], c["model"]) for c in chunks} == {("a", "a")}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == " six"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks)
    assert out.endswith(RESUMED + sse.encode(sse.DONE))


def test_a_tool_call_is_seen() -> None:
    stitched = Stitched()
    stitched.take(_chunk(tool_calls=[{"index": 0, "function": {"name": "f"}}]))

    assert stitched.tool_started


class _NoTransport:
    """Building a kind sends nothing: it only prepares its transport for its link."""

    def prepare(self, link: object, name: str) -> None:
        pass


@pytest.mark.parametrize(("entry", "dialect"), [
    ({"type": "openai", "base_url": "http://x/v1"}, "instruction"),
    ({"type": "openai", "base_url": "http://x/v1", "continue_final_message": True},
     "continue_final_message"),
    ({"type": "anthropic", "api_key": "an-key-000000"}, "prefill"),
    ({"type": "google", "api_key": "g-key-0000"}, "instruction"),  # no prefill in Gemini
    ({"type": "ollama"}, "prefill"),  # its templates leave a final assistant message open
])
def test_each_kind_says_how_it_is_asked_to_continue(entry: dict[str, Any], dialect: str) -> None:
    text = json.dumps({"providers": {"p": {**entry, "models": {"a": "m"}}}})
    (spec,) = llms_config.parse(text, Path("llms.json"), {}).enabled

    assert load_kinds()[spec.kind](spec, _NoTransport()).continues() == dialect  # type: ignore[arg-type]


def test_gemini_reads_a_continuation_in_words_as_its_own_turns() -> None:
    contents = to_gemini(continuation(BODY, "It was ", "instruction", 3))["contents"]

    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == [{"text": "It was "}]
    assert contents[2]["parts"] == [{"text": INSTRUCTION}]


def test_anthropic_reads_a_prefill_as_a_final_assistant_turn_without_trailing_space() -> None:
    messages = to_messages(continuation(BODY, "It was \n", "prefill", 3), "claude")["messages"]

    assert messages[-1]["role"] == "assistant"
    assert _blocks_text(messages[-1]["content"]) == "It was"


@pytest.mark.parametrize(("asked", "sent", "left"), [
    ({"max_tokens": 100}, 30, {"max_tokens": 70}),
    ({"max_completion_tokens": 100}, 30, {"max_completion_tokens": 70}),
    ({"max_tokens": 100}, 120, {"max_tokens": 1}),  # over budget: still asks for one token
    ({}, 30, {}),  # no budget asked: none set
])
def test_the_output_budget_shrinks_by_what_was_sent(asked: dict[str, int], sent: int,
                                                     left: dict[str, int]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **asked}

    out = continuation(body, "It was", "continue_final_message", sent)

    assert {k: out[k] for k in ("max_tokens", "max_completion_tokens") if k in out} == left


def _blocks_text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(b["text"] for b in content)
