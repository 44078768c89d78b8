"""Streams end honestly: a broken upstream shows as an error, a leaving client stops the GPU."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import Pair
from tests.gateway_process import ROOT, GatewayProcess, config, provider
from tests.upstream import FakeUpstream, ok, slow_first_token, stream_cut
from tests.waiting import wait_until

BODY = {"model": "chat-model", "messages": [{"role": "user", "content": "hello"}], "stream": True}


def test_upstream_dying_mid_stream_ends_with_an_error_event_not_done(pair: Pair) -> None:
    pair.primary.set_mode(stream_cut(after_chunks=2))

    lines = pair.stream_lines()

    assert "data: [DONE]" not in lines
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == "provider_error"
    assert "primary" in error["message"]
    content = [json.loads(line[6:]) for line in lines[:-1]]
    assert all("choices" in chunk for chunk in content), "what arrived before the cut is relayed"
    assert pair.secondary.requests == [], "after the first byte there is no failover"


def test_sdk_raises_instead_of_returning_a_truncated_answer(pair: Pair) -> None:
    pair.primary.set_mode(stream_cut(after_chunks=1))
    stream = pair.client().chat.completions.create(model="chat-model",
                                                   messages=BODY["messages"], stream=True)

    with pytest.raises(openai.APIError):
        for _ in stream:
            pass


def _leave_after_the_first_event(pair: Pair) -> float:
    """Open a stream, read its first event, hang up; when the client left."""
    with httpx.stream("POST", f"{pair.gateway.base_url}/chat/completions", json=BODY) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
    return time.monotonic()


def test_client_leaving_mid_stream_cancels_the_upstream(pair: Pair) -> None:
    pair.primary.set_mode(ok(content=" ".join(["word"] * 200), delay_between_chunks=0.05))

    started = _leave_after_the_first_event(pair)

    assert pair.primary.wait_for_cancel(timeout=5)
    assert time.monotonic() - started < 1.0


def test_client_leaving_while_the_upstream_is_quiet_mid_stream_cancels_it(pair: Pair) -> None:
    # Nothing to write for 5 s after the first word: only watching the connection notices.
    pair.primary.set_mode(ok(content="one two three", delay_between_chunks=5.0))

    started = _leave_after_the_first_event(pair)

    assert pair.primary.wait_for_cancel(timeout=5)
    assert time.monotonic() - started < 1.0
    logged = pair.gateway.wait_for_log("request")[-1]
    assert logged["outcome"] == "client_disconnected"


def test_client_leaving_before_the_first_token_cancels_the_upstream(pair: Pair) -> None:
    pair.primary.set_mode(slow_first_token(10))
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(json.dumps(BODY))}\r\n\r\n"
        f"{json.dumps(BODY)}"
    ).encode()

    with socket.create_connection(("127.0.0.1", pair.gateway.port)) as sock:
        sock.sendall(request)
        wait_until(lambda: pair.primary.requests, what="the gateway waiting on the slow upstream")
    started = time.monotonic()

    assert pair.primary.wait_for_cancel(timeout=5)
    assert time.monotonic() - started < 1.0, "the gateway must notice the client left at once"
    assert pair.secondary.requests == []


def test_non_streaming_client_leaving_cancels_the_upstream(pair: Pair) -> None:
    pair.primary.set_mode(slow_first_token(10))

    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{pair.gateway.base_url}/chat/completions",
                   json={**BODY, "stream": False}, timeout=0.5)

    assert pair.primary.wait_for_cancel(timeout=3)


def test_streams_that_end_or_fail_and_clients_that_leave_leave_no_garbage(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    # 60 clients at once read a slow stream to its end, 60 read one its upstream cuts, 60 leave
    # one mid-stream, 60 before the first token, 60 before a whole answer. What reference
    # counting frees costs no pause; a cycle per request waits for the collector, and once made
    # 60-90 ms pauses under load (a disconnect guard and the task it watched; a closed upstream
    # connection and its parser; a failure's traceback and the connection it came from).
    streaming = upstream_factory("streaming")
    streaming.set_mode(ok(content=" ".join(["word"] * 10), delay_between_chunks=0.03))
    cut = upstream_factory("cut")
    cut.set_mode(stream_cut(after_chunks=1))
    thinking = upstream_factory("thinking")
    thinking.set_mode(slow_first_token(10))
    path = tmp_path / "llms.json"
    path.write_text(json.dumps(config({
        "streaming": provider(streaming.base_url, {"slow-stream": "m"}),
        # by host name: every cut stream's new connection asks the DNS cache
        "cut": provider(cut.base_url.replace("127.0.0.1", "localhost"), {"cut-stream": "m"}),
        "thinking": provider(thinking.base_url, {"slow-start": "m"})})))

    ran = subprocess.run([sys.executable, "-m", "tests.garbage_left_by_requests", str(path),
                          "60", str(tmp_path / "garbage.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert ran.returncode == 0, ran.stderr[-3000:]
    assert streaming.cancelled >= 60 and thinking.cancelled >= 120
    assert len(cut.requests) >= 60
    garbage = json.loads((tmp_path / "garbage.json").read_text())
    assert sum(garbage.values()) < 60, garbage


def test_gateway_keeps_serving_after_faults(pair: Pair) -> None:
    pair.primary.set_mode(stream_cut(after_chunks=1))
    pair.stream_lines()
    pair.primary.set_mode(ok())

    assert pair.stream_lines()[-1] == "data: [DONE]"


def test_a_stream_that_stalls_mid_way_ends_with_an_idle_timeout_event(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    stalling = upstream_factory("stalling")
    stalling.set_mode(ok(content="one two three", delay_between_chunks=2.0))
    gateway = start_gateway(config({
        "stalling": provider(stalling.base_url, {"m": "m"}, timeouts={"idle": 0.3}),
    }))

    started = time.monotonic()
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions",
                      json={**BODY, "model": "m"}) as resp:
        lines = [line for line in resp.iter_lines() if line]

    assert time.monotonic() - started < 1.5
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert "idle_timeout" in error["message"]
    assert gateway.log_events("request")[-1]["outcome"] == "error"
