"""Connections to upstreams: kept and reused, a kept one the upstream dropped costs nothing, and
one that cannot be made (refused, a name that does not resolve) fails over at once.

A stream that closed its upstream response at `[DONE]` threw the connection away; a request
sent on a kept-alive connection just as the upstream closed it as idle failed. Both are about
connections a client never sees, so these tests count them at the upstream.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import Pair
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, Reply, ok, refusing_url


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


def drops_kept_alive_connections(dropped: list[int]) -> Reply:
    """Answers the first request on a connection and closes it, unanswered, on the next: what
    an upstream timing out an idle connection does to a request that arrives in that moment.
    Each dropped request goes into `dropped`."""

    def reply(transport: asyncio.Transport, body: bytes, nth: int) -> None:
        if nth > 1:
            dropped.append(nth)
            transport.close()
            return
        if json.loads(body).get("stream"):
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n"
                            + b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHUNK), CHUNK))
        else:
            transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))

    return reply


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_kept_alive_connection_the_upstream_dropped_costs_the_client_nothing(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]], stream: bool) -> None:
    dropped: list[int] = []
    base_url, counts = scripted(drops_kept_alive_connections(dropped))
    gateway = start_gateway(config({"only": provider(base_url, {"m": "m"})}))

    for _ in range(3):
        response = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10, json={
            "model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200, response.text
        assert "kept" in response.text
        assert response.headers["x-llms-provider"] == "only"

    assert len(dropped) == 2, "requests 2 and 3 went out on a kept connection first"
    assert counts["connections"] == 3
    assert all(line["outcome"] == "completed" for line in gateway.log_events("request"))


def test_an_upstream_talking_out_of_turn_on_an_idle_connection_costs_the_next_request_nothing(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]]) -> None:
    strayed = threading.Event()

    def stray(transport: asyncio.Transport) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\n")
        strayed.set()

    def chatty(transport: asyncio.Transport, body: bytes, n: int) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))
        asyncio.get_running_loop().call_later(0.05, stray, transport)

    base_url, _ = scripted(chatty)
    gateway = start_gateway(config({"up": provider(base_url, {"m": "m"})}))

    first = _ask(gateway)
    assert strayed.wait(5)  # the stray bytes arrive while the connection is idle
    second = _ask(gateway)

    # aiohttp parses each answer with a fresh parser: the half answer is dropped, and the next
    # request reads its own. (A whole stray answer would be queued for the next request:
    # aiohttp issue 13656, docs/deployment.md.)
    assert (first.status_code, second.status_code) == (200, 200), second.text
    assert second.json()["choices"][0]["message"]["content"] == "kept"


def test_a_refused_connection_fails_over_at_once(
        start_gateway: Callable[..., GatewayProcess], secondary: FakeUpstream) -> None:
    secondary.reset()
    gateway = start_gateway(config({"down": provider(refusing_url(), {"m": "m"}),
                                    "up": provider(secondary.base_url, {"m": "m"})}))
    _ask(gateway)  # warmed up

    started = time.monotonic()
    answer = _ask(gateway)
    elapsed = time.monotonic() - started

    assert answer.headers["x-llms-provider"] == "up"
    assert elapsed < 0.5, "a refusal is an answer: no timeout is waited for"
    assert gateway.wait_for_log("request", 2)[-1]["failed"] == ["down:unavailable"]


def test_a_name_that_does_not_resolve_fails_over_like_a_refused_connection(
        start_gateway: Callable[..., GatewayProcess], secondary: FakeUpstream) -> None:
    secondary.reset()
    # .invalid never resolves (RFC 2606); the timeout bounds a resolver that is slow to say so.
    nowhere = provider("http://no-such-upstream.invalid/v1", {"m": "m"},
                       timeouts={"connect": 2})
    gateway = start_gateway(config({"nowhere": nowhere,
                                    "secondary": provider(secondary.base_url, {"m": "m"})}))

    answer = _ask(gateway)

    assert answer.status_code == 200
    assert answer.headers["x-llms-provider"] == "secondary"
    assert answer.headers["x-llms-attempts"] == "2"
    logged = gateway.wait_for_log("request")[-1]
    assert logged["failed"] in (["nowhere:unavailable"], ["nowhere:connect_timeout"])


def _ask(gateway: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=10, json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]})
