"""The fake upstream itself: each mode does what the gateway's tests rely on, on real sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from tests.upstream import (
    FakeUpstream,
    hang,
    invalid_json,
    ok,
    refusing_url,
    slow_first_token,
    sse_garbage,
    status,
    stream_cut,
)
from tests.waiting import wait_until

MESSAGES = [{"role": "user", "content": "say hello to me"}]


@pytest.fixture(scope="module")
def shared() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="primary", models=("m1", "m2")) as upstream:
        yield upstream


@pytest.fixture
def up(shared: FakeUpstream) -> FakeUpstream:
    shared.reset()
    return shared


def sdk(up: FakeUpstream, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=up.base_url, api_key="sk-fake", max_retries=0, **kwargs)


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_ok_chat_answers_with_the_requested_model_and_records_the_request(
        up: FakeUpstream) -> None:
    up.set_mode(ok(reasoning="thinking"))

    reply = sdk(up).chat.completions.create(model="upstream-id", messages=MESSAGES, n=2)

    assert [c.message.content for c in reply.choices] == ["Hello from primary"] * 2
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.model == "upstream-id"
    assert reply.choices[0].message.model_extra == {"reasoning_content": "thinking"}
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
    [seen] = up.requests
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == "Bearer sk-fake"
    assert up.last_json == json.loads(seen.body)
    assert up.last_json["model"] == "upstream-id"


def test_ok_stream_sends_role_pieces_finish_usage_then_done(up: FakeUpstream) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True,
            "stream_options": {"include_usage": True}}

    response = httpx.post(f"{up.base_url}/chat/completions", json=body)

    assert response.headers["content-type"].startswith("text/event-stream")
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hello"},
                      {"content": " from"}, {"content": " primary"}, {}]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                   "total_tokens": 10}


def test_sdk_streams_custom_chunks(up: FakeUpstream) -> None:
    up.set_mode(ok(chunks=["a", "b", "c"], finish_reason="length"))

    stream = sdk(up).chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = [c for c in stream if c.choices]

    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "abc"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_modes_queue_up_and_the_last_one_repeats(up: FakeUpstream) -> None:
    up.set_mode(status(503), ok(content="fine"))
    url = f"{up.base_url}/chat/completions"

    codes = [httpx.post(url, json={"model": "m", "messages": MESSAGES}).status_code
             for _ in range(3)]
    models = httpx.get(f"{up.base_url}/models").json()

    assert codes == [503, 200, 200]
    assert [m["id"] for m in models["data"]] == ["m1", "m2"]
    assert models["data"][0]["owned_by"] == "primary"
    assert [r.method for r in up.requests] == ["POST"] * 3 + ["GET"]


def test_status_sends_an_error_envelope_and_retry_after(up: FakeUpstream) -> None:
    up.set_mode(status(429, "slow down", retry_after=3))

    with pytest.raises(openai.RateLimitError) as caught:
        sdk(up).chat.completions.create(model="m", messages=MESSAGES)

    assert caught.value.response.headers["retry-after"] == "3"
    assert caught.value.body == {"message": "slow down", "type": "rate_limit_error",
                                 "code": None, "param": None}


def test_status_body_is_sent_verbatim(up: FakeUpstream) -> None:
    vllm = '{"object":"error","message":"bad","type":"BadRequestError","param":null,"code":400}'
    up.set_mode(status(400, body=vllm))

    response = httpx.post(f"{up.base_url}/chat/completions", json={"model": "m"})

    assert (response.status_code, response.text) == (400, vllm)


def test_stream_cut_ends_without_done_and_the_client_sees_a_payload_error(
        up: FakeUpstream) -> None:
    up.set_mode(stream_cut(after_chunks=2))

    async def read() -> tuple[bytes, BaseException | None]:
        received = b""
        async with aiohttp.ClientSession() as session, session.post(
                f"{up.base_url}/chat/completions",
                json={"model": "m", "messages": MESSAGES, "stream": True}) as response:
            try:
                async for chunk in response.content.iter_any():
                    received += chunk
            except aiohttp.ClientPayloadError as error:
                return received, error
        return received, None

    received, error = asyncio.run(read())

    assert isinstance(error, aiohttp.ClientPayloadError)
    data = sse_data(received.decode())
    assert "[DONE]" not in data
    assert [json.loads(d)["choices"][0]["delta"] for d in data] == [
        {"role": "assistant", "content": ""}, {"content": "Hello"}, {"content": " from"}]
    assert up.cancelled == 0, "the fake cut the stream; the client did not leave"


def test_stream_cut_without_streaming_sends_a_truncated_body(up: FakeUpstream) -> None:
    up.set_mode(stream_cut())

    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{up.base_url}/chat/completions", json={"model": "m"})


def test_hang_counts_a_cancel_when_the_client_gives_up(up: FakeUpstream) -> None:
    up.set_mode(hang())

    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{up.base_url}/chat/completions", json={"model": "m"}, timeout=0.3)

    assert up.wait_for_cancel(timeout=2)
    assert up.cancelled == 1


def test_leaving_mid_stream_counts_a_cancel(up: FakeUpstream) -> None:
    up.set_mode(ok(content=" ".join(["word"] * 100), delay_between_chunks=0.02))
    body = {"model": "m", "messages": MESSAGES, "stream": True}

    with httpx.stream("POST", f"{up.base_url}/chat/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")

    assert up.wait_for_cancel(timeout=2)


def test_slow_first_token_withholds_even_the_headers(up: FakeUpstream) -> None:
    up.set_mode(slow_first_token(0.3, then=status(502)))

    started = time.monotonic()
    response = httpx.post(f"{up.base_url}/chat/completions", json={"model": "m"})

    assert time.monotonic() - started >= 0.3
    assert response.status_code == 502


@pytest.mark.parametrize("stream", [False, True])
def test_invalid_json_and_sse_garbage(up: FakeUpstream, stream: bool) -> None:
    up.set_mode(invalid_json(), sse_garbage())
    url = f"{up.base_url}/chat/completions"
    body = {"model": "m", "stream": stream}

    first, second = (httpx.post(url, json=body) for _ in range(2))

    assert first.headers["content-type"].startswith("application/json")
    with pytest.raises(json.JSONDecodeError):
        first.json()
    expected = "text/event-stream" if stream else "application/json"
    assert second.status_code == 200
    assert second.headers["content-type"].startswith(expected)
    assert "[DONE]" not in second.text


def test_a_body_that_is_not_json_is_a_400_and_still_recorded(up: FakeUpstream) -> None:
    response = httpx.post(f"{up.base_url}/chat/completions", content=b"not json")

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert (up.requests[0].body, up.last_json) == (b"not json", None)


def test_completions_echo_and_logprobs_per_prompt(up: FakeUpstream) -> None:
    reply = sdk(up).completions.create(model="m", prompt=["Say", "Tell"], n=2, echo=True,
                                       logprobs=1)

    assert [c.text for c in reply.choices] == ["Say" + "Hello from primary"] * 2 + \
        ["Tell" + "Hello from primary"] * 2
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["Say", "Hello", " from", " primary"]
    assert logprobs.text_offset == [0, 3, 8, 13]
    assert reply.object == "text_completion"


def test_completions_stream(up: FakeUpstream) -> None:
    stream = sdk(up).completions.create(model="m", prompt="Say", stream=True,
                                        stream_options={"include_usage": True})
    chunks = list(stream)

    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello from primary"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_responses_answers_with_output_text(up: FakeUpstream) -> None:
    reply = sdk(up).responses.create(model="m", input="hi there")

    assert reply.output_text == "Hello from primary"
    assert reply.usage is not None and reply.usage.input_tokens == 2
    assert up.requests[0].path == "/v1/responses"


def test_refusing_url_refuses() -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{refusing_url()}/models")


def test_stop_with_a_request_in_flight_is_quick_and_leaves_nothing_behind(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    before = threading.active_count()
    up = FakeUpstream(name="short-lived").start()
    up.set_mode(hang())
    errors: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(f"{up.base_url}/chat/completions", json={}, timeout=5)
        except httpx.HTTPError as error:
            errors.append(error)

    client = threading.Thread(target=call)
    client.start()
    wait_until(lambda: up.requests, what="the request held by the hung fake")

    started = time.monotonic()
    up.stop()
    client.join(5)

    assert time.monotonic() - started < 1
    assert len(errors) == 1, "the hung request is closed, not answered"
    assert threading.active_count() == before
    assert up.cancelled == 0, "stop() is not a client leaving"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
