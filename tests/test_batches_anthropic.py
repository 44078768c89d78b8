"""Batches relayed to Anthropic's Message Batches: the OpenAI SDK makes a batch of chat requests
for an alias an `anthropic` provider with `"batches": "native"` serves first; the gateway makes
a message batch of them (each request translated to a Messages body), shows it as OpenAI's
`Batch`, and serves its results as OpenAI's output and error files.

Every story is the SDK through a real socket to the gateway process, and the gateway to the
fake Anthropic, which answers its batches endpoints as Anthropic does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from providers.kinds import anthropic_batches as batches
from providers.kinds.anthropic import to_chat_completion
from tests.fake_anthropic import BATCH_KEY, FakeAnthropic
from tests.gateway_process import GatewayProcess, provider
from tests.openapi import validate
from tests.test_batches import BOB, chat_line, finished, keyed, lines_of, raw, sdk, submit
from tests.upstream import FakeUpstream

UPSTREAM = "claude-sonnet-4-5"


@pytest.fixture
def claude() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(name="claude", models=(UPSTREAM,)) as fake:
        yield fake


def anthropic(base_url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "anthropic", "base_url": base_url, "api_key": BATCH_KEY,
            "batches": "native", "models": {"claude": UPSTREAM, "gone": "claude-retired"},
            **extra}


@pytest.fixture
def gateway(start_gateway: Callable[..., GatewayProcess], claude: FakeAnthropic,
            upstream_factory: Callable[[str], FakeUpstream]) -> GatewayProcess:
    here = upstream_factory("here")
    return start_gateway(keyed({"claude": anthropic(claude.base_url),
                                "here": provider(here.base_url, {"m": "m"})}))


def test_a_chat_batch_runs_as_a_message_batch_with_its_answers_and_errors_as_openai_files(
        gateway: GatewayProcess, claude: FakeAnthropic) -> None:
    alice = sdk(gateway)
    lines = [chat_line(f"req-{n}", model="claude", text=f"question {n}") for n in range(3)]
    lines.append(chat_line("retired", model="gone"))

    made = submit(alice, lines)
    assert made.status == "in_progress" and made.metadata == {"story": "test"}
    validate(raw(gateway, f"/batches/{made.id}"), "Batch")
    # One message batch, each request a Messages body for the upstream's model.
    [create] = [r for r in claude.requests if r.path == "/v1/messages/batches"]
    assert create.headers["x-api-key"] == BATCH_KEY
    assert create.headers["anthropic-version"] == "2023-06-01"
    sent = {r["custom_id"]: r["params"] for r in create.json["requests"]}
    assert list(sent) == ["req-0", "req-1", "req-2", "retired"]
    assert sent["req-1"] == {"model": UPSTREAM, "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "question 1"}]}]}
    assert sent["retired"]["model"] == "claude-retired"

    done = finished(alice, made.id)
    shown = raw(gateway, f"/batches/{made.id}")
    validate(shown, "Batch")
    assert shown["status"] == "completed" and shown["input_file_id"] == made.input_file_id
    assert shown["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert shown["created_at"] <= shown["completed_at"]
    assert shown["metadata"] == {"story": "test"}

    output = lines_of(alice, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == ["req-0", "req-1", "req-2"]
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        validate(body, "CreateChatCompletionResponse")
        assert body["choices"][0]["message"]["content"] == "Hello from claude"
        assert body["usage"]["prompt_tokens"] == 10 and body["model"] == UPSTREAM
    [retired] = lines_of(alice, done.error_file_id)
    assert retired["custom_id"] == "retired" and retired["response"]["status_code"] == 404
    assert retired["response"]["body"]["error"]["message"] == "model: claude-retired"
    # The output files are the key's, and no other key's.
    assert {f["id"] for f in raw(gateway, "/files")["data"]} == {
        made.input_file_id, done.output_file_id, done.error_file_id}
    bob = sdk(gateway, BOB)
    for attempt in (lambda: bob.batches.retrieve(made.id),
                    lambda: bob.files.content(done.output_file_id or "")):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert [b["id"] for b in raw(gateway, "/batches")["data"]] == [made.id]


def test_a_cancelled_message_batch_puts_its_requests_not_run_in_the_error_file(
        gateway: GatewayProcess, claude: FakeAnthropic) -> None:
    alice = sdk(gateway)
    made = submit(alice, [chat_line(f"r{n}", model="claude") for n in range(3)])

    cancelling = alice.batches.cancel(made.id)
    assert cancelling.status == "cancelling"
    assert claude.requests[-1].path == f"/v1/messages/batches/{made.id}/cancel"
    done = finished(alice, made.id)

    shown = raw(gateway, f"/batches/{made.id}")
    validate(shown, "Batch")
    assert shown["status"] == "cancelled" and shown["cancelling_at"] <= shown["cancelled_at"]
    assert shown["request_counts"] == {"total": 3, "completed": 0, "failed": 0}
    assert done.output_file_id is None
    errors = lines_of(alice, done.error_file_id)
    assert sorted(line["custom_id"] for line in errors) == ["r0", "r1", "r2"]
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert all(line["response"] is None for line in errors)


def test_what_a_message_batch_cannot_take_is_refused_or_run_by_the_gateway(
        gateway: GatewayProcess, claude: FakeAnthropic) -> None:
    alice = sdk(gateway)
    assert not batches.CUSTOM_ID.fullmatch("request #1")
    with pytest.raises(openai.BadRequestError) as refused:
        submit(alice, [chat_line("ok", model="claude"), chat_line("request #1", model="claude")])
    assert "Line 2" in refused.value.message and "custom_id" in refused.value.message
    # A file whose models do not all go first to the message batches' provider runs here.
    mixed = finished(alice, submit(alice, [chat_line("a", model="claude"),
                                           chat_line("b", model="m")]).id)
    assert mixed.status == "completed" and not mixed.id.startswith("msgbatch_")
    assert not [r for r in claude.requests if r.path == "/v1/messages/batches"]


def test_a_key_anthropic_refuses_is_a_provider_failure_not_a_500(
        start_gateway: Callable[..., GatewayProcess], claude: FakeAnthropic) -> None:
    gateway = start_gateway(keyed({"claude": anthropic(claude.base_url,
                                                       api_key="sk-ant-wrong-key-000000")}))
    with pytest.raises(openai.APIStatusError) as refused:
        submit(sdk(gateway), [chat_line("a", model="claude")])
    assert refused.value.status_code == 502, "a provider failure, not the gateway's"
    assert "sk-ant-wrong-key" not in str(refused.value.body)
    assert claude.requests[-1].path == "/v1/messages/batches"


def _batch(status: str, cancelled: bool = False, **counts: int) -> bytes:
    return json.dumps({
        "id": "msgbatch_1", "type": "message_batch", "processing_status": status,
        "request_counts": {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0,
                           "expired": 0, **counts},
        "created_at": "2026-11-26T06:00:00.5Z", "expires_at": "2026-11-27T06:00:00.5Z",
        "ended_at": "2026-11-26T07:00:00Z" if status == "ended" else None,
        "cancel_initiated_at": "2026-11-26T06:30:00Z" if cancelled else None,
        "results_url": None}).encode()


@pytest.mark.parametrize(("status", "cancelled", "counts", "shown", "files"), [
    ("in_progress", False, {"processing": 2}, "in_progress", set()),
    ("canceling", True, {"processing": 2}, "cancelling", set()),
    ("ended", False, {"succeeded": 2}, "completed", {"output_file_id"}),
    ("ended", True, {"succeeded": 1, "canceled": 1}, "cancelled",
     {"output_file_id", "error_file_id"}),
    ("ended", False, {"errored": 1, "expired": 1}, "expired", {"error_file_id"}),
])
def test_a_message_batch_is_shown_as_openai_s_batch(
        status: str, cancelled: bool, counts: dict[str, int], shown: str,
        files: set[str]) -> None:
    batch = batches.batch_object(batches.read_batch(_batch(status, cancelled, **counts)))

    assert batch["status"] == shown
    assert batch["request_counts"]["total"] == sum(counts.values())
    assert {name for name in ("output_file_id", "error_file_id") if name in batch} == files
    assert batch["created_at"] == batch["in_progress_at"] < batch["expires_at"]
    if status == "ended":
        assert batch[f"{shown}_at"] == batch["created_at"] + 3600


def test_results_become_openai_s_output_and_error_lines() -> None:
    results = b"\n".join(json.dumps(line).encode() for line in [
        {"custom_id": "ok", "result": {"type": "succeeded", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": UPSTREAM,
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 1}}}},
        {"custom_id": "bad", "result": {"type": "errored", "error": {
            "type": "invalid_request_error", "message": "max_tokens: Field required"}}},
        {"custom_id": "late", "result": {"type": "expired"}}])

    [ok] = [json.loads(line) for line in batches.results_file(
        results, batches.OUTPUT, to_chat_completion).splitlines()]
    bad, late = [json.loads(line) for line in batches.results_file(
        results, batches.ERRORS, to_chat_completion).splitlines()]

    assert ok["custom_id"] == "ok" and ok["response"]["request_id"] == "msg_1"
    assert ok["response"]["body"]["choices"][0]["message"]["content"] == "hi"
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"]["error"]["type"] == "invalid_request_error"
    assert late["error"]["code"] == "batch_expired" and late["response"] is None
