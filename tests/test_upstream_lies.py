"""Upstream answers are checked, not trusted: a wrong shape, a malformed event, a cut choice,
keep-alive comments or bytes that are not UTF-8 are a failover before the stream is committed,
and an honest in-band error after it; never a 500, never a stream that looks finished.

The lying upstreams are raw servers (`scripted`) writing exactly the bytes a test gives them;
the honest secondary is a `FakeUpstream`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, Reply

MESSAGES = [{"role": "user", "content": "hello"}]
Scripted = Callable[[Reply], tuple[str, dict[str, int]]]


def _whole(body: bytes) -> Reply:
    def reply(transport: asyncio.Transport, _: bytes, __: int) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return reply


def _stream(events: list[bytes], gap: float = 0.05) -> Reply:
    """Write each of `events` `gap` seconds apart on an SSE answer, then close the body."""
    def reply(transport: asyncio.Transport, _: bytes, __: int) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                        b"Connection: close\r\n\r\n")
        loop = asyncio.get_running_loop()
        for number, event in enumerate(events):
            loop.call_later(gap * number, transport.write, event)
        loop.call_later(gap * len(events), transport.close)
    return reply


def _chunk(index: int = 0, content: str | None = "Hi", finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return b"data: " + json.dumps({
        "id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"


def _gateway(start_gateway: Callable[..., GatewayProcess], liar_url: str,
             secondary: FakeUpstream, **timeouts: Any) -> GatewayProcess:
    defaults = {"timeouts": {"connect": 2, "first_token": 5, "idle": 5, "total": 20, **timeouts}}
    return start_gateway(config({
        "liar": provider(liar_url, {"m": "m"}),
        "honest": provider(secondary.base_url, {"m": "m"}),
    }, defaults=defaults))


def _chat(gateway: GatewayProcess, **extra: Any) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": "m", "messages": MESSAGES, **extra})


@pytest.mark.parametrize("body", [b'{"choices": "xyz"}', b'{"choices": [1, 2]}',
                                  b'{"choices": [{"message": 5}]}',
                                  '{"choices": [{"message": {"content": "\xff"}}]}'.encode(
                                      "latin-1")],
                         ids=["choices-str", "choices-ints", "message-int", "not-utf8"])
def test_a_200_of_the_wrong_shape_fails_over_to_the_next_provider(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream], body: bytes) -> None:
    liar_url, _ = scripted(_whole(body))
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"))

    response = _chat(gateway)

    assert response.status_code == 200, response.text
    assert response.headers["x-llms-provider"] == "honest"
    assert response.headers["x-llms-attempts"] == "2"


NOT_UTF8 = b'data: {"choices": [{"index": 0, "delta": {"content": "\xff"}}]}\n\n'


@pytest.mark.parametrize("first", [b'data: {"choices": [1]}\n\n', b'data: ["x"]\n\n',
                                   b"data: {not json\n\n", NOT_UTF8],
                         ids=["choice-int", "array", "not-json", "not-utf8"])
def test_a_stream_whose_first_event_is_malformed_fails_over_before_anything_is_sent(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream], first: bytes) -> None:
    liar_url, _ = scripted(_stream([first, _chunk(finish="stop"), b"data: [DONE]\n\n"]))
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"))

    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as response:
        body = response.read()

    assert response.headers["x-llms-provider"] == "honest"
    assert body.decode("utf-8").rstrip().endswith("data: [DONE]")


def _streamed(gateway: GatewayProcess, **extra: Any) -> tuple[bytes, list[str]]:
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": "m", "messages": MESSAGES, "stream": True,
                            **extra}) as response:
        assert response.status_code == 200
        body = response.read()
    lines = [line for line in body.decode("utf-8").split("\n") if line.startswith("data:")]
    return body, lines


@pytest.mark.parametrize("bad", [b'data: ["x"]\n\n', b"data: {not json\n\n", NOT_UTF8],
                         ids=["array", "not-json", "not-utf8"])
def test_a_malformed_event_mid_stream_ends_it_with_an_in_band_error_logged_as_upstreams(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream], bad: bytes) -> None:
    liar_url, _ = scripted(_stream([_chunk(), bad, _chunk(finish="stop"),
                                    b"data: [DONE]\n\n"]))
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"))

    body, lines = _streamed(gateway)

    body.decode("utf-8")  # nothing the client cannot decode was passed on
    assert "[DONE]" not in body.decode()
    assert '"error"' in lines[-1] and "not a JSON answer chunk" in lines[-1]
    assert gateway.wait_for_log("request")[-1]["outcome"] == "error"


def test_with_two_choices_a_stream_that_ends_one_and_cuts_the_other_is_not_complete(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    liar_url, _ = scripted(_stream([_chunk(0), _chunk(1), _chunk(0, None, "stop")]))
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"))

    body, lines = _streamed(gateway, n=2)

    assert "[DONE]" not in body.decode()
    assert "stream ended before it finished" in lines[-1]


def test_keep_alive_comments_are_no_first_token_and_the_next_provider_answers_in_time(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    liar_url, _ = scripted(_stream([b": ping\n\n"] * 200, gap=0.1))  # 20 s of pings
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"), first_token=1)

    started = time.monotonic()
    _, lines = _streamed(gateway)
    elapsed = time.monotonic() - started

    assert lines[-1] == "data: [DONE]"
    assert elapsed < 6, "waited past first_token (1 s) for a provider that only pinged"


def test_with_two_choices_asked_a_stream_that_never_starts_the_second_is_not_complete(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    liar_url, _ = scripted(_stream([_chunk(0), _chunk(0, None, "stop")]))
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"))

    body, lines = _streamed(gateway, n=2)

    assert "[DONE]" not in body.decode()
    assert "stream ended before it finished" in lines[-1]


def test_a_malformed_event_split_across_writes_still_ends_with_an_error_the_client_can_read(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    # On /completions chunks pass as they come: the first half of the bad line is relayed
    # before the gateway can know it is bad.
    liar_url, _ = scripted(_stream([_chunk(), b"data: {not", b" json\n\n", _chunk(finish="stop"),
                                    b"data: [DONE]\n\n"]))
    gateway = _gateway(start_gateway, liar_url, upstream_factory("honest"))

    with httpx.stream("POST", f"{gateway.base_url}/completions", timeout=30,
                      json={"model": "m", "prompt": "hello", "stream": True}) as response:
        body = response.read()

    events = [event for event in body.decode("utf-8").split("\n\n") if event.strip()]
    assert "[DONE]" not in body.decode()
    assert events[-1].startswith("data: ") and "error" in json.loads(events[-1][6:])
    assert gateway.wait_for_log("request")[-1]["outcome"] == "error"


def _anthropic_event(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload)}\n\n".encode()


def test_an_anthropic_event_of_the_wrong_shape_mid_stream_is_the_upstreams_fault_in_band(
        start_gateway: Callable[..., GatewayProcess], scripted: Scripted,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    start = {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 1}}}
    block = {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}}
    text = {"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "Hi"}}
    liar_url, _ = scripted(_stream([_anthropic_event(e) for e in (
        start, block, text, {"type": "content_block_delta", "index": 0, "delta": "x"})]))
    gateway = start_gateway(config({
        "liar": {"type": "anthropic", "base_url": liar_url.removesuffix("/v1"),
                 "api_key": "an-key-000000", "models": {"m": "m"}},
        "honest": provider(upstream_factory("honest").base_url, {"m": "m"}),
    }))

    body, lines = _streamed(gateway)

    assert "[DONE]" not in body.decode()
    assert "bad_response" in lines[-1] and "could not be read" in lines[-1]
    assert gateway.wait_for_log("upstream_answer_unreadable")[-1]["provider"] == "liar"
    assert not gateway.log_events("unhandled_stream_error")
