"""Non-streamed requests fail over early: the gateway asks upstream for a stream and assembles it.

The answer the client gets must be the one the provider would have given whole, field by field,
and a provider that hangs is given up after `first_token`, not `total`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, Mode, hang, ok, stream_cut, tool_call

HI = [{"role": "user", "content": "hi"}]


def whole_from(upstream: FakeUpstream, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the upstream itself answers to the whole request."""
    answer = httpx.post(f"{upstream.base_url}/{path}", json={**body, "model": "m"})
    assert answer.status_code == 200
    return dict(answer.json())


def without_created(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "created"}


@pytest.mark.parametrize(("mode", "extra"), [
    (ok("Hello there, friend"), {}),
    (ok("Because.", reasoning="Let me think."), {}),
    (tool_call("get_weather", '{"city": "Paris", "unit": "C"}'), {"tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}}]}),
    (ok("Scored words"), {"logprobs": True, "top_logprobs": 1}),
    (ok("Two of us"), {"n": 2}),
    (ok("No usage here", usage=False), {}),
], ids=["text", "reasoning", "tools", "logprobs", "n2", "no-usage"])
def test_the_assembled_answer_equals_the_upstream_s_whole_answer(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], mode: Mode,
        extra: dict[str, Any]) -> None:
    up = upstream_factory("up")
    up.set_mode(mode)
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))
    body = {"model": "m", "messages": HI, **extra}

    via_gateway = httpx.post(f"{gateway.base_url}/chat/completions", json=body).json()
    sent = up.last_json
    upstream_whole = whole_from(up, "chat/completions", body)

    assert sent["stream"] is True, "asked upstream as a stream"
    if mode.usage:
        assert sent["stream_options"] == {"include_usage": True}
    expected = without_created(upstream_whole)
    for choice in expected["choices"]:  # the gateway names reasoning both ways, whole or not
        if "reasoning_content" in choice["message"]:
            choice["message"]["reasoning"] = choice["message"]["reasoning_content"]
    expected.setdefault("usage", None)  # no usage counted: said as null
    assert without_created(via_gateway) == expected


def test_a_legacy_completion_is_assembled_too(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))
    body = {"model": "m", "prompt": ["one", "two"], "n": 2}

    via_gateway = httpx.post(f"{gateway.base_url}/completions", json=body).json()

    assert up.last_json["stream"] is True
    assert without_created(via_gateway) == without_created(
        whole_from(up, "completions", body))


def test_a_primary_that_hangs_a_whole_request_is_failed_over_after_first_token(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    stuck, backup = upstream_factory("stuck"), upstream_factory("backup")
    stuck.set_mode(hang())
    gateway = start_gateway(config(
        {"stuck": provider(stuck.base_url, {"m": "m"}),
         "backup": provider(backup.base_url, {"m": "m"})},
        defaults={"timeouts": {"connect": 2, "first_token": 1.5, "idle": 5, "total": 60}}))

    started = time.monotonic()
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=90,
                        json={"model": "m", "messages": HI})
    waited = time.monotonic() - started

    assert answer.status_code == 200 and answer.headers["x-llms-provider"] == "backup"
    assert waited < 30, f"gave up after first_token (1.5 s), not total (60 s): {waited:.1f}s"
    assert answer.json()["choices"][0]["message"]["content"] == "Hello from backup"
    assert stuck.wait_for_cancel(), "the hung upstream request was closed"


def test_a_stream_cut_before_the_end_is_a_failover_for_a_whole_request(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    cut, backup = upstream_factory("cut"), upstream_factory("backup")
    cut.set_mode(stream_cut(after_chunks=2))
    gateway = start_gateway(config({"cut": provider(cut.base_url, {"m": "m"}),
                                    "backup": provider(backup.base_url, {"m": "m"})}))

    answer = httpx.post(f"{gateway.base_url}/chat/completions",
                        json={"model": "m", "messages": HI})

    assert answer.headers["x-llms-provider"] == "backup"
    assert answer.json()["choices"][0]["message"]["content"] == "Hello from backup"


def test_stream_upstream_false_asks_for_the_whole_answer(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"},
                                                   stream_upstream=False)}))
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

    answer = httpx.post(f"{gateway.base_url}/chat/completions", content=raw)

    assert answer.status_code == 200
    assert up.requests[-1].body == raw, "relayed byte for byte, as before"


def test_an_answer_of_more_events_than_max_answer_events_fails_over_as_bad_response(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    chatty, backup = upstream_factory("chatty"), upstream_factory("backup")
    chatty.set_mode(ok(chunks=["a"] * 50))  # one event a piece, and a few around them
    gateway = start_gateway(config({"chatty": provider(chatty.base_url, {"m": "m"},
                                                       max_answer_events=20),
                                    "backup": provider(backup.base_url, {"m": "m"})}))

    answer = httpx.post(f"{gateway.base_url}/chat/completions",
                        json={"model": "m", "messages": HI})
    wait_until(lambda: bool(gateway.log_events("request")))  # written once the answer is sent
    (request,) = gateway.log_events("request")

    assert answer.status_code == 200 and answer.headers["x-llms-provider"] == "backup"
    assert request["failed"] == ["chatty:bad_response"]


def test_the_same_events_in_any_framing_assemble_into_the_same_answer() -> None:
    from gateway.adapters.assemble import ChatAssembler

    events = [b'{"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
              b'"content":"Hel"}}]}',
              b'{"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}']
    framings = {
        "lf": b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n",
        "crlf": b"".join(b"data: " + e + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n",
        "comments": b"".join(b": ping\ndata:" + e + b"\n\n" for e in events)
        + b"data: [DONE]\n\n",
    }
    answers = {}
    for name, body in framings.items():
        assembler = ChatAssembler()
        for at in range(0, len(body), 7):  # in pieces that split lines and events
            assembler.feed(body[at:at + 7])
        assert assembler.done and not assembler.broken, name
        answers[name] = assembler.answer()

    assert answers["lf"] == answers["crlf"] == answers["comments"]
    assert answers["lf"]["choices"][0]["message"]["content"] == "Hello"


def test_plain_chunks_and_chunks_with_more_assemble_alike() -> None:
    """Common chunks (a role and text) take a typed fast path; chunks with anything more take
    the general one. Mixed in one stream, every field still lands where a whole answer has it."""
    from gateway.adapters.assemble import ChatAssembler

    class General(ChatAssembler):  # every chunk by the general path, for comparison
        def _data(self, payload: bytes) -> None:
            super(ChatAssembler, self)._data(payload)

    events = [
        b'{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m",'
        b'"system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant",'
        b'"content":""},"logprobs":null,"finish_reason":null}]}',
        b'{"id":"c1","choices":[{"index":0,"delta":{"content":"Hel"},"stop_reason":null}]}',
        b'{"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}',
        b'{"id":"c1","choices":[{"index":0,"delta":{"content":"lo"},"logprobs":{"content":'
        b'[{"token":"lo","logprob":-0.1,"bytes":[108,111],"top_logprobs":[]}]}}]}',
        b'{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1",'
        b'"type":"function","function":{"name":"f","arguments":"{}"}}]}}]}',
        b'{"id":"c1","choices":[{"index":1,"delta":{"role":"assistant","content":"B"}}]}',
        b'{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop",'
        b'"stop_reason":42,"matched_stop":"x"}]}',
        b'{"id":"c1","choices":[{"index":1,"delta":{},"finish_reason":"length"}]}',
        b'{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,'
        b'"total_tokens":7}}',
    ]
    body = b"".join(b"data: " + e + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    fast, general = ChatAssembler(choices=2), General(choices=2)
    for assembler in (fast, general):
        assembler.feed(body)

    answer = fast.answer()
    assert fast.done and general.done and fast.data_events == general.data_events
    assert answer == general.answer()
    first = answer["choices"][0]
    assert first["message"]["content"] == "Hello" and first["stop_reason"] == 42


def test_an_error_event_or_garbage_breaks_the_assembly_on_either_path() -> None:
    from gateway.adapters.assemble import ChatAssembler

    for event, broken_by in ((b'{"error":{"message":"boom"}}', "error_event"),
                             (b'{"object":"error","message":"boom"}', "error_event"),
                             (b'{"choices":[{"index":0,"delta":{"content":"x"}}', "malformed"),
                             (b'[1,2]', "malformed")):
        assembler = ChatAssembler()
        assembler.feed(b"data: " + event + b"\n\n")
        assert assembler.broken, event
        assert getattr(assembler, broken_by), event
