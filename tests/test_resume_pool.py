"""Resume on the pool: vLLM workers (the fake `vllm serve`) break and continue, streamed and
whole; and real llama.cpp continues a partial answer without starting a new turn.

A fake vLLM worker answers a 200-word text (`FAKE_VLLM_ANSWER`), honours
`continue_final_message` as vLLM does, and is cut mid-stream by `/fake/fault` (its connection
dropped, as when the engine dies mid-answer).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.pool_helpers import wait_for_workers
from tests.test_pool_vllm import MODEL, Env, free_ports, pool_entry
from tests.upstream import FakeUpstream, ok, status, stream_cut

WORDS = 200
ANSWER = " ".join(f"w{i}" for i in range(WORDS))
HALF = WORDS // 2
SENT = " ".join(f"w{i}" for i in range(HALF))
MESSAGES = [{"role": "user", "content": "count for me"}]


@dataclass
class Pooled:
    gateway: GatewayProcess
    before: FakeUpstream  # the model's candidates: before the pool, and after it
    after: FakeUpstream
    worker: str  # the one fake vLLM worker's root URL

    def answered(self, streamed: bool) -> tuple[str, dict[str, Any], str]:
        """The answer's text and usage, and how it said it was resumed."""
        body: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}
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
        text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        return text, events[-1]["usage"], lines[-2]

    def cut_next(self, after: int) -> None:
        httpx.post(f"{self.worker}/fake/fault", json={"cut_after": after}).raise_for_status()

    def last_request(self) -> dict[str, Any]:
        seen: dict[str, Any] = httpx.get(f"{self.worker}/fake/last_request").json()
        return seen


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pooled]:
    tmp = tmp_path_factory.mktemp("resume-pool")
    env = Env(tmp, gpus=2, FAKE_VLLM_ANSWER=ANSWER, FAKE_VLLM_TOKEN_DELAY="0.001")
    with FakeUpstream(name="before") as before, FakeUpstream(name="after") as after:
        doc = config({"before": provider(before.base_url, {MODEL: "m"}),
                      "local": pool_entry(free_ports(1)),
                      "after": provider(after.base_url, {MODEL: "m"},
                                        continue_final_message=True)},
                     defaults={"circuit": {"enabled": False}}, models={MODEL: {"resume": True}})
        gateway = GatewayProcess(tmp, doc, env=env.vars).start()
        (worker,) = wait_for_workers(gateway, "ready")
        yield Pooled(gateway, before, after, worker["url"].removesuffix("/v1"))
        gateway.stop()


@pytest.fixture
def fresh(pooled: Pooled) -> Pooled:
    pooled.before.reset()
    pooled.after.reset()
    return pooled


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_a_vllm_worker_cut_halfway_is_finished_by_the_next_candidate(
        fresh: Pooled, streamed: bool) -> None:
    fresh.before.set_mode(status(503))  # down: the pool answers first
    fresh.after.set_mode(ok(content=ANSWER))
    fresh.cut_next(HALF)

    text, usage, said = fresh.answered(streamed)

    assert text == ANSWER and said in (": resumed", "1")
    asked = fresh.after.last_json
    assert asked["messages"] == [*MESSAGES, {"role": "assistant", "content": SENT}]
    assert usage["completion_tokens"] == WORDS
    assert usage["total_tokens"] == usage["prompt_tokens"] + WORDS


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_a_vllm_worker_continues_a_cut_answer_in_the_same_turn(
        fresh: Pooled, streamed: bool) -> None:
    fresh.before.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))

    text, usage, said = fresh.answered(streamed)

    assert text == ANSWER and said in (": resumed", "1")
    asked = fresh.last_request()
    assert asked["messages"] == [*MESSAGES, {"role": "assistant", "content": SENT}]
    assert asked["continue_final_message"] is True and asked["add_generation_prompt"] is False
    assert usage["completion_tokens"] == WORDS
    assert fresh.after.requests == []
