"""Resume on each kind: Gemini and Ollama as the provider that breaks and as the one that
continues, each streamed and whole (a whole answer assembled from a stream).

Every story cuts the first upstream at half of a 200-word answer; the one that continues is a
fake that knows the whole answer and goes on from the partial one as its real service does:
Gemini asked in words (it has no prefill: it repeats a few words, trimmed at the seam), Ollama
from a final assistant message (a prefill), the vLLM-like `openai` provider told by
`continue_final_message`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_gemini import FakeGemini
from tests.fake_ollama import FakeOllama
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import REPEATED_WORDS, FakeUpstream, ok, status, stream_cut

WORDS = 200
ANSWER = " ".join(f"w{i}" for i in range(WORDS))
HALF = WORDS // 2
SENT = " ".join(f"w{i}" for i in range(HALF))
MESSAGES = [{"role": "user", "content": "count for me"}]


@dataclass
class Kinds:
    gateway: GatewayProcess
    fakes: dict[str, FakeUpstream]

    def answered(self, model: str, streamed: bool) -> tuple[str, dict[str, Any], str]:
        """The answer's text and usage, and how it said it was resumed (the SSE comment, or
        the header of a whole answer)."""
        body: dict[str, Any] = {"model": model, "messages": MESSAGES}
        if not streamed:
            resp = httpx.post(f"{self.gateway.base_url}/chat/completions", json=body, timeout=20)
            assert resp.status_code == 200, resp.text
            answer = resp.json()
            assert answer["choices"][0]["finish_reason"] == "stop"
            return (answer["choices"][0]["message"]["content"], answer["usage"],
                    resp.headers.get("x-llms-resumed", ""))
        body.update(stream=True, stream_options={"include_usage": True})
        with httpx.stream("POST", f"{self.gateway.base_url}/chat/completions", json=body,
                          timeout=20) as resp:
            assert resp.status_code == 200
            lines = [line for line in resp.iter_lines() if line]
        assert lines.count("data: [DONE]") == 1 and lines[-1] == "data: [DONE]"
        events = [json.loads(line[6:]) for line in lines
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert len({(e["id"], e["created"]) for e in events}) == 1, "one answer's identity"
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert finishes == ["stop"]
        return text, events[-1]["usage"], lines[-2]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kinds]:
    with FakeUpstream(name="first") as first, FakeUpstream(name="vllm") as vllm, \
            FakeGemini(name="gemini") as gemini, FakeOllama(name="ollama") as ollama, \
            FakeUpstream(name="limited") as limited:
        doc = config({
            "first": provider(first.base_url, {"gemini-continues": "m",
                                               "ollama-continues": "m", "cooled": "m"}),
            "gemini": {"type": "google", "base_url": gemini.base_url, "api_key": "g-key-0000",
                       "models": {"gemini-breaks": "gemini-2.5-flash",
                                  "gemini-continues": "gemini-2.5-flash"}},
            "ollama": {"type": "ollama", "base_url": ollama.base_url,
                       "models": {"ollama-breaks": "llama3.2", "ollama-continues": "llama3.2"}},
            "limited": provider(limited.base_url, {"cooled": "m", "warm": "m"},
                                circuit={"enabled": True}),
            "vllm": provider(vllm.base_url, {"gemini-breaks": "m", "ollama-breaks": "m",
                                             "cooled": "m", "warm": "m"},
                             continue_final_message=True),
        }, defaults={"circuit": {"enabled": False}},
            models={alias: {"resume": True} for alias in (
                "gemini-breaks", "gemini-continues", "ollama-breaks", "ollama-continues",
                "cooled")})
        gateway = GatewayProcess(Path(tmp_path_factory.mktemp("resume-kinds")), doc).start()
        yield Kinds(gateway, {"first": first, "vllm": vllm, "gemini": gemini, "ollama": ollama,
                              "limited": limited})
        gateway.stop()


@pytest.fixture
def fresh(kinds: Kinds) -> Kinds:
    for fake in kinds.fakes.values():
        fake.reset()
    return kinds


def _cut(fresh: Kinds, breaks: str, continues: str) -> None:
    fresh.fakes[breaks].set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))
    fresh.fakes[continues].set_mode(ok(content=ANSWER))


def _summed(usage: dict[str, Any], completion: int) -> None:
    assert usage["completion_tokens"] == completion, "both parts' completion tokens, summed"
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("kind", ["gemini", "ollama"])
def test_a_stream_of_the_kind_cut_halfway_is_finished_by_the_next_candidate(
        fresh: Kinds, kind: str, streamed: bool) -> None:
    _cut(fresh, kind, "vllm")

    text, usage, said = fresh.answered(f"{kind}-breaks", streamed)

    assert text == ANSWER and said in (": resumed", "1")
    asked = fresh.fakes["vllm"].last_json
    assert asked["messages"] == [*MESSAGES, {"role": "assistant", "content": SENT}]
    assert asked["continue_final_message"] is True
    _summed(usage, WORDS)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_gemini_continues_a_cut_answer_asked_in_words_and_its_repeat_is_trimmed(
        fresh: Kinds, streamed: bool) -> None:
    _cut(fresh, "first", "gemini")

    text, usage, said = fresh.answered("gemini-continues", streamed)

    assert text == ANSWER and said in (": resumed", "1")
    contents = fresh.fakes["gemini"].last_json["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == [{"text": SENT}]
    assert "cut off" in contents[2]["parts"][0]["text"]
    # Gemini bills the words it repeated at the seam: the client is not told fewer.
    _summed(usage, WORDS + REPEATED_WORDS)


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_ollama_continues_a_cut_answer_from_a_prefill(fresh: Kinds, streamed: bool) -> None:
    _cut(fresh, "first", "ollama")

    text, usage, said = fresh.answered("ollama-continues", streamed)

    assert text == ANSWER and said in (": resumed", "1")
    asked = fresh.fakes["ollama"].last_json
    assert asked["messages"] == [*MESSAGES, {"role": "assistant", "content": SENT}], \
        "the partial answer as the last message, which Ollama goes on from"
    assert "continue_final_message" not in asked
    _summed(usage, WORDS)


def test_the_request_log_names_the_provider_that_finished_the_answer(fresh: Kinds) -> None:
    _cut(fresh, "first", "ollama")
    rid = "resumed-by-ollama"
    body = {"model": "ollama-continues", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{fresh.gateway.base_url}/chat/completions", json=body,
                      headers={"x-request-id": rid}, timeout=20) as resp:
        assert b"[DONE]" in resp.read()

    found: list[dict[str, Any]] = []

    def logged() -> bool:
        found[:] = [r for r in fresh.gateway.log_events("request") if r.get("request_id") == rid]
        return bool(found)

    wait_until(logged)
    assert found[0]["provider"] == "first" and found[0]["resumed_by"] == "ollama"


def test_a_candidate_cooling_down_is_asked_to_continue_only_after_the_others(
        fresh: Kinds) -> None:
    limited, vllm = fresh.fakes["limited"], fresh.fakes["vllm"]
    limited.set_mode(status(429, retry_after=60), ok(content=ANSWER))
    warmed = httpx.post(f"{fresh.gateway.base_url}/chat/completions", timeout=20,
                        json={"model": "warm", "messages": MESSAGES})
    assert warmed.headers["x-llms-provider"] == "vllm", "limited is cooling down now"
    _cut(fresh, "first", "vllm")

    text, _, said = fresh.answered("cooled", streamed=True)

    assert text == ANSWER and said == ": resumed"
    assert len(limited.requests) == 1, "next in file order, but cooling down: passed over"
    assert vllm.last_json["continue_final_message"] is True
