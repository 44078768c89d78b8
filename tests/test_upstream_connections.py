"""Connections to upstreams: kept and reused, and a kept one the upstream dropped costs nothing.

A stream that closed its upstream response at `[DONE]` threw the connection away; a request
sent on a kept-alive connection just as the upstream closed it as idle failed. Both are about
connections a client never sees, so these tests count them at the upstream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import Pair
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import ok, whole_request_body


def test_streams_from_a_server_that_ends_its_body_late_share_one_upstream_connection(
        pair: Pair) -> None:
    # uvicorn (vLLM's server) writes the body's end apart from `[DONE]`; closing the upstream
    # response at `[DONE]` would throw its connection away and make every stream connect anew.
    pair.primary.set_mode(ok(end_delay=0.02))

    for _ in range(10):
        assert pair.stream_lines()[-1] == "data: [DONE]"

    assert len(pair.primary.requests) == 10
    assert pair.primary.connections <= 2, "streams must reuse the pooled upstream connection"
    assert pair.primary.cancelled == 0


def test_an_upstream_that_never_ends_its_body_after_done_does_not_hold_the_client(
        pair: Pair) -> None:
    pair.primary.set_mode(ok(end_delay=30))

    started = time.monotonic()
    lines = pair.stream_lines()

    assert lines[-1] == "data: [DONE]"
    assert time.monotonic() - started < 2.0
    assert pair.primary.wait_for_cancel(timeout=3), "the gateway let go of that connection"


COMPLETION = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "kept"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
CHUNK = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"kept"},"finish_reason":"stop"}]}\n\n'
         b"data: [DONE]\n\n")


class DropsKeptAliveConnections(asyncio.Protocol):
    """Answers the first request on a connection and closes it, unanswered, on the next: what
    an upstream timing out an idle connection does to a request that arrives in that moment."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.answered = False
        self.buffer = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.counts["connections"] += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        body = whole_request_body(self.buffer)
        if body is None:
            return
        self.buffer = b""
        if self.answered:
            self.counts["dropped"] += 1
            self.transport.close()
            return
        self.answered = True
        if json.loads(body).get("stream"):
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n"
                                 + b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHUNK), CHUNK))
        else:
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))


@pytest.fixture
def dropping_upstream() -> Iterator[tuple[str, dict[str, int]]]:
    counts = {"connections": 0, "dropped": 0}
    sock = socket.create_server(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(
        loop.create_server(lambda: DropsKeptAliveConnections(counts), sock=sock))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", counts
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_kept_alive_connection_the_upstream_dropped_costs_the_client_nothing(
        start_gateway: Callable[..., GatewayProcess],
        dropping_upstream: tuple[str, dict[str, int]], stream: bool) -> None:
    base_url, counts = dropping_upstream
    gateway = start_gateway(config({"only": provider(base_url, {"m": "m"})}))

    for _ in range(3):
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10, json={
            "model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200, response.text
        assert "kept" in response.text
        assert response.headers["x-llms-provider"] == "only"

    assert counts["dropped"] == 2, "requests 2 and 3 went out on a kept connection first"
    assert counts["connections"] == 3
    assert all(line["outcome"] == "completed" for line in gateway.log_events("request"))
