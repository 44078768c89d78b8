"""Batches through `/v1/files` and `/v1/batches`: the OpenAI SDK uploads a file of requests, the
gateway runs each through its own pipeline (routing, failover, limits, spend, as the key that
made the batch) and hands back OpenAI's output and error files.

Every story is the SDK through a real socket to the gateway process, and the gateway to fake
upstreams; every object the gateway answers is checked against OpenAI's published schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fake_openai_batches import FakeOpenAIBatches
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.openapi import validate
from tests.postgres_server import PostgresServer
from tests.upstream import FakeUpstream, held, ok, status

ALICE, BOB = "sk-alice-batches-0001", "sk-bob-batches-0002"
FAST = {"concurrency": 2, "poll_interval": 0.1, "lease": 2}


def keyed(providers: dict[str, Any], **batches: Any) -> dict[str, Any]:
    return config(providers, server={"api_keys": [{"key": ALICE, "id": "alice"},
                                                  {"key": BOB, "id": "bob"}]},
                  batches={**FAST, **batches})


def sdk(gateway: GatewayProcess, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)


def chat_line(custom_id: str, model: str = "m", text: str = "hello") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": 8,
                     "messages": [{"role": "user", "content": text}]}}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def raw(gateway: GatewayProcess, path: str, key: str = ALICE) -> Any:
    """The gateway's JSON answer as sent, for the schema checks."""
    answer = httpx.get(f"{gateway.base_url}{path}", timeout=10,
                       headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def submit(client: openai.OpenAI, lines: list[dict[str, Any]],
           endpoint: str = "/v1/chat/completions") -> Any:
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                 completion_window="24h", metadata={"story": "test"})


def finished(client: openai.OpenAI, batch_id: str, within: float = 30.0,
             states: tuple[str, ...] = ("completed", "failed", "cancelled", "expired")) -> Any:
    found: list[Any] = []

    def over() -> bool:
        found.append(client.batches.retrieve(batch_id))
        return found[-1].status in states

    wait_until(over, within)
    return found[-1]


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines() if line]


@pytest.fixture
def upstream(upstream_factory: Callable[[str], FakeUpstream]) -> FakeUpstream:
    return upstream_factory("main")


def test_a_batch_completes_with_its_answers_and_a_refused_request_in_the_error_file(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    strict = upstream_factory("strict")
    strict.set_mode(status(400, "max_tokens is too large for this model"))
    gateway = start_gateway(keyed({"main": provider(upstream.base_url, {"m": "m-up"}),
                                   "strict": provider(strict.base_url, {"picky": "picky-up"})}))
    client = sdk(gateway)
    requests = [chat_line(f"req-{n}", text=f"question {n}") for n in range(5)]
    requests.insert(2, chat_line("refused", model="picky"))

    uploaded = client.files.create(file=("requests.jsonl", jsonl(requests)), purpose="batch")
    validate(raw(gateway, f"/files/{uploaded.id}"), "OpenAIFile")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(requests))
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"story": "test"})
    assert batch.status == "validating" and batch.request_counts is not None
    assert batch.request_counts.total == 6 and batch.metadata == {"story": "test"}

    done = finished(client, batch.id)
    shown = raw(gateway, f"/batches/{batch.id}")
    validate(shown, "Batch")
    assert shown["status"] == "completed"
    assert shown["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    assert shown["created_at"] <= shown["in_progress_at"] <= shown["finalizing_at"] \
        <= shown["completed_at"]
    assert shown["usage"]["input_tokens"] > 0 and shown["usage"]["output_tokens"] > 0

    output, errors = lines_of(client, done.output_file_id), lines_of(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"req-{n}" for n in range(5)]
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["request_id"] and line["id"].startswith("batch_req_")
        validate(line["response"]["body"], "CreateChatCompletionResponse")
    [refused] = errors
    assert refused["custom_id"] == "refused"
    assert refused["response"]["status_code"] == 400
    assert "too large" in refused["response"]["body"]["error"]["message"]
    # Each request went upstream once, as the model id its provider wants.
    assert sorted(r.json["messages"][0]["content"] for r in upstream.requests) == \
        [f"question {n}" for n in range(5)]
    assert {r.json["model"] for r in upstream.requests} == {"m-up"}
    # The output files are the key's too, and listed with its other files.
    listed = raw(gateway, "/files")
    validate(listed, "ListFilesResponse")
    assert {f["id"] for f in listed["data"]} == {uploaded.id, done.output_file_id,
                                                 done.error_file_id}
    assert {f["purpose"] for f in listed["data"] if f["id"] != uploaded.id} == {"batch_output"}
    batches = raw(gateway, "/batches?limit=5")
    validate(batches, "ListBatchesResponse")
    assert [b["id"] for b in batches["data"]] == [batch.id]
    # The requests were the key's: its spend counts them.
    wait_until(lambda: httpx.get(f"{gateway.url}/admin/spend?group_by=key", timeout=5)
               .json()["data"] != [], 10)
    spend = {row["group"]: row for row in httpx.get(
        f"{gateway.url}/admin/spend?group_by=key", timeout=5).json()["data"]}
    assert (spend["alice"]["requests"], spend["alice"]["refused"]) == (6, 0)  # a provider said no


def test_an_embeddings_batch_and_a_line_for_another_endpoint_fails_validation(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(keyed({"main": provider(upstream.base_url, {"e": "e-up"})}))
    client = sdk(gateway)
    embed = [{"custom_id": f"e{n}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": "e", "input": f"text {n}"}} for n in range(3)]

    done = finished(client, submit(client, embed, "/v1/embeddings").id)

    assert done.status == "completed"
    assert [line["response"]["body"]["object"] for line in lines_of(client, done.output_file_id)
            ] == ["list"] * 3
    wrong = finished(client, submit(client, [*embed, chat_line("chat")], "/v1/embeddings").id)
    shown = raw(gateway, f"/batches/{wrong.id}")
    validate(shown, "Batch")
    assert shown["status"] == "failed" and "failed_at" in shown
    assert [(e["code"], e["line"]) for e in shown["errors"]["data"]] == [("invalid_url", 4)]


def test_a_batch_fails_over_like_any_request(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    down = upstream_factory("down")
    down.set_mode(status(503, "overloaded"))
    gateway = start_gateway(keyed({"down": provider(down.base_url, {"m": "m-down"}),
                                   "main": provider(upstream.base_url, {"m": "m-up"})}))
    client = sdk(gateway)

    done = finished(client, submit(client, [chat_line(f"r{n}") for n in range(4)]).id)

    assert done.status == "completed" and done.error_file_id is None
    assert done.request_counts is not None and done.request_counts.completed == 4
    assert len(lines_of(client, done.output_file_id)) == 4
    assert len(upstream.requests) == 4 and len(down.requests) >= 1


def test_cancel_lets_running_requests_finish_and_starts_no_more(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    upstream.set_mode(held())
    gateway = start_gateway(keyed({"main": provider(upstream.base_url, {"m": "m"})}))
    client = sdk(gateway)
    batch = submit(client, [chat_line(f"r{n}") for n in range(6)])
    wait_until(lambda: len(upstream.requests) == 2)  # the batch's two at a time

    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    validate(raw(gateway, f"/batches/{batch.id}"), "Batch")
    upstream.release()
    done = finished(client, batch.id)

    shown = raw(gateway, f"/batches/{batch.id}")
    validate(shown, "Batch")
    assert shown["status"] == "cancelled" and shown["cancelling_at"] <= shown["cancelled_at"]
    assert shown["request_counts"] == {"total": 6, "completed": 2, "failed": 0}
    assert len(lines_of(client, done.output_file_id)) == 2
    assert len(upstream.requests) == 2, "no request started after the cancel"
    assert client.batches.cancel(batch.id).status == "cancelled", "cancelling again is a no-op"


def test_another_key_finds_nothing_of_a_batch_nor_its_files(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(keyed({"main": provider(upstream.base_url, {"m": "m"})}))
    alice, bob = sdk(gateway), sdk(gateway, BOB)
    done = finished(alice, submit(alice, [chat_line("mine")]).id)
    assert done.output_file_id is not None

    for attempt in (lambda: bob.batches.retrieve(done.id),
                    lambda: bob.batches.cancel(done.id),
                    lambda: bob.files.retrieve(done.input_file_id),
                    lambda: bob.files.content(done.output_file_id or ""),
                    lambda: bob.files.delete(done.input_file_id),
                    lambda: bob.batches.create(input_file_id=done.input_file_id,
                                               endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert ALICE not in str(refused.value.body)
    assert raw(gateway, "/files", BOB)["data"] == []
    assert raw(gateway, "/batches", BOB)["data"] == []
    with pytest.raises(openai.AuthenticationError):
        sdk(gateway, "sk-nobody").files.list()
    deleted = httpx.delete(f"{gateway.base_url}/files/{done.input_file_id}", timeout=5,
                           headers={"Authorization": f"Bearer {ALICE}"})
    validate(deleted.json(), "DeleteFileResponse")
    assert deleted.json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(done.input_file_id)


def test_a_file_too_large_is_413_and_a_bad_line_is_a_400_naming_it(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(keyed({"main": provider(upstream.base_url, {"m": "m"})},
                                  max_file_bytes=4096, max_lines=5, max_line_bytes=512))
    client = sdk(gateway)

    with pytest.raises(openai.APIStatusError) as too_large:
        client.files.create(file=("big.jsonl", jsonl([chat_line(f"r{n}", text="x" * 300)
                                                      for n in range(20)])), purpose="batch")
    assert too_large.value.status_code == 413
    bad = jsonl([chat_line("a")]) + b'{"custom_id": "b", "method": "POST"}\n'
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("bad.jsonl", bad), purpose="batch")
    assert "Line 2" in refused.value.message
    for lines, named in (([chat_line("a"), chat_line("a")], "Line 2"),
                         ([chat_line("a", text="y" * 600)], "Line 1"),
                         ([chat_line(f"r{n}") for n in range(6)], "at most 5")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.files.create(file=("f.jsonl", jsonl(lines)), purpose="batch")
        assert named in refused.value.message
    assert raw(gateway, "/files")["data"] == [], "nothing refused was kept"


def test_a_gateway_restarted_mid_batch_finishes_it_with_every_result_once(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    upstream.set_mode(ok(), ok(), ok(), held())
    gateway = start_gateway(keyed({"main": provider(upstream.base_url, {"m": "m"})}))
    client = sdk(gateway)
    batch = submit(client, [chat_line(f"r{n}", text=f"q{n}") for n in range(10)])
    wait_until(lambda: len(upstream.requests) == 5)  # three answered, two held

    gateway.stop()
    upstream.set_mode(ok())
    gateway.start()
    done = finished(client, batch.id)

    assert done.status == "completed"
    assert done.request_counts is not None and done.request_counts.completed == 10
    output = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{n}" for n in range(10))
    asked = [r.json["messages"][0]["content"] for r in upstream.requests]
    assert set(asked) == {f"q{n}" for n in range(10)}
    assert len(asked) == 12, "only the two running at the stop were sent again"


def test_a_batch_for_a_provider_that_runs_batches_is_relayed_there(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    with FakeOpenAIBatches(name="openai") as native:
        gateway = start_gateway(keyed({
            "openai": provider(native.base_url, {"gpt": "gpt-4o-mini"}, batches="native"),
            "main": provider(upstream.base_url, {"m": "m"})}))
        alice = sdk(gateway)

        relayed = submit(alice, [chat_line("a", model="gpt"), chat_line("b", model="gpt")])
        done = finished(alice, relayed.id)
        run_here = finished(alice, submit(alice, [chat_line("c")]).id)

        # The upstream's own object, relayed as it sent it.
        assert raw(gateway, f"/batches/{relayed.id}") == native.batches[relayed.id]
        assert done.status == "completed" and relayed.id in native.batches
        output = lines_of(alice, done.output_file_id)
        assert [line["custom_id"] for line in output] == ["a", "b"]
        assert output[0]["response"]["body"]["choices"][0]["message"]["content"] == \
            "Hello from openai"
        uploaded = native.contents[relayed.input_file_id].decode().splitlines()
        assert {json.loads(line)["body"]["model"] for line in uploaded} == {"gpt-4o-mini"}
        assert run_here.status == "completed" and run_here.id not in native.batches
        assert len(upstream.requests) == 1 and native.requests == [], "no request ran here"
        # The relayed batch and its files are the key's like any other.
        bob = sdk(gateway, BOB)
        with pytest.raises(openai.NotFoundError):
            bob.batches.retrieve(relayed.id)
        with pytest.raises(openai.NotFoundError):
            bob.files.content(done.output_file_id or "")
        cancelled = submit(alice, [chat_line("d", model="gpt")])
        assert alice.batches.cancel(cancelled.id).status == "cancelling"
        assert alice.batches.retrieve(cancelled.id).status == "cancelled"


@pytest.mark.skipif(not PostgresServer.available(),
                    reason="PostgreSQL's binaries are not installed")
def test_two_replicas_on_one_postgresql_share_a_batch_and_keep_each_result_once(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    postgres = PostgresServer().start()
    try:
        upstream.set_mode(held())
        doc = {**keyed({"main": provider(upstream.base_url, {"m": "m"})}),
               "database": {"url": postgres.url}}
        first, second = start_gateway(doc), start_gateway(doc)
        batch = submit(sdk(first), [chat_line(f"r{n}", text=f"q{n}") for n in range(12)])
        wait_until(lambda: len(upstream.requests) == 4)  # two held by each replica

        upstream.set_mode(ok())
        upstream.release()
        done = finished(sdk(second), batch.id)

        assert done.status == "completed"
        output = lines_of(sdk(second), done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(f"r{n}" for n in range(12))
        assert sorted(r.json["messages"][0]["content"] for r in upstream.requests) == \
            sorted(f"q{n}" for n in range(12)), "each request ran once, on one replica"
        assert first.log_events("request") and second.log_events("request")
    finally:
        postgres.close()


def test_two_workers_on_one_sqlite_file_share_a_batch_and_keep_each_result_once(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    upstream.set_mode(held())
    gateway = GatewayProcess(tmp_path, keyed({"main": provider(upstream.base_url, {"m": "m"})}),
                             extra_args=("--workers", "2"))
    try:
        gateway.start(timeout=60)  # two workers start on a machine others share
        batch = submit(sdk(gateway), [chat_line(f"r{n}", text=f"q{n}") for n in range(12)])
        wait_until(lambda: len(upstream.requests) == 4, 30)  # two held by each worker

        upstream.set_mode(ok())
        upstream.release()
        done = finished(sdk(gateway), batch.id)
        output = lines_of(sdk(gateway), done.output_file_id)
    finally:
        gateway.stop()

    assert done.status == "completed"
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{n}" for n in range(12))
    assert sorted(r.json["messages"][0]["content"] for r in upstream.requests) == \
        sorted(f"q{n}" for n in range(12)), "each request ran once, in one worker"
    assert done.request_counts is not None and done.request_counts.completed == 12
    assert len({line["pid"] for line in gateway.log_events("request")}) == 2
