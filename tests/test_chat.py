"""A client points the OpenAI SDK at the gateway and gets answers, streamed or not."""

from __future__ import annotations

import asyncio

import httpx

from tests.conftest import Pair
from tests.openapi import validate

MESSAGES = [{"role": "user", "content": "hello"}]


def test_sdk_gets_an_answer_from_the_first_provider(pair: Pair) -> None:
    completion = pair.client().chat.completions.create(model="chat-model", messages=MESSAGES)

    assert completion.choices[0].message.content == "Hello from primary"
    assert pair.secondary.requests == []


def test_alias_is_rewritten_and_unknown_fields_reach_the_provider(pair: Pair) -> None:
    pair.client().chat.completions.create(
        model="chat-model", messages=MESSAGES, temperature=0.2,
        extra_body={"top_k": 7, "min_p": 0.05, "repetition_penalty": 1.1,
                    "chat_template_kwargs": {"thinking": False}, "vendor_extra": [1, 2]},
    )

    sent = pair.primary.last_json
    assert sent["model"] == "primary-upstream-id"
    assert sent["temperature"] == 0.2
    assert sent["top_k"] == 7 and sent["min_p"] == 0.05 and sent["repetition_penalty"] == 1.1
    assert sent["chat_template_kwargs"] == {"thinking": False}
    assert sent["vendor_extra"] == [1, 2]


def test_body_is_relayed_byte_for_byte_when_nothing_changes(pair: Pair) -> None:
    raw = (b'{"model": "primary-only",   "messages": [{"role":"user","content":"hi"}], '
           b'"stream": true, "stream_options": {"include_usage": true}, "x": 1.50}')
    with httpx.stream("POST", f"{pair.gateway.base_url}/chat/completions",
                      content=raw) as response:
        response.read()

    assert response.status_code == 200
    assert pair.primary.requests[-1].body == raw


def test_response_says_who_served_it_and_echoes_the_request_id(pair: Pair) -> None:
    raw = pair.client().chat.completions.with_raw_response.create(
        model="chat-model", messages=MESSAGES, extra_headers={"x-request-id": "my-trace-42"})

    assert raw.headers["x-llms-provider"] == "primary"
    assert raw.headers["x-llms-attempts"] == "1"
    assert raw.headers["x-request-id"] == "my-trace-42"
    validate(raw.http_response.json(), "CreateChatCompletionResponse")


def test_a_request_id_is_made_when_the_client_sends_none(pair: Pair) -> None:
    response = httpx.post(f"{pair.gateway.base_url}/chat/completions",
                          json={"model": "chat-model", "messages": MESSAGES})

    assert len(response.headers["x-request-id"]) >= 16


def test_streaming_answer_arrives_in_pieces_and_ends_with_done(pair: Pair) -> None:
    with httpx.stream("POST", f"{pair.gateway.base_url}/chat/completions",
                      json={"model": "chat-model", "messages": MESSAGES, "stream": True}) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-llms-provider"] == "primary"
        lines = [line for line in resp.iter_lines() if line]

    assert lines[-1] == "data: [DONE]"
    chunks = [httpx.Response(200, content=line[6:]).json() for line in lines[:-1]]
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "Hello from primary"


def test_sdk_stream_with_include_usage(pair: Pair) -> None:
    stream = pair.client().chat.completions.create(
        model="chat-model", messages=MESSAGES, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)

    assert pair.primary.last_json["stream_options"] == {"include_usage": True}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "Hello from primary"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens > 0


def test_async_client_streams_and_completes(pair: Pair) -> None:
    async def run() -> tuple[str, str]:
        client = pair.async_client()
        completion = await client.chat.completions.create(model="chat-model", messages=MESSAGES)
        stream = await client.chat.completions.create(model="chat-model", messages=MESSAGES,
                                                      stream=True)
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        await client.close()
        return completion.choices[0].message.content or "", "".join(pieces)

    whole, streamed = asyncio.run(run())
    assert whole == streamed == "Hello from primary"


def test_n_choices_come_back(pair: Pair) -> None:
    completion = pair.client().chat.completions.create(model="chat-model", messages=MESSAGES, n=3)

    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert pair.primary.last_json["n"] == 3


def test_legacy_completions_with_prompt_list_echo_and_logprobs(pair: Pair) -> None:
    completion = pair.client().completions.create(
        model="chat-model", prompt=["Say A", "Say B"], echo=True, logprobs=2, max_tokens=5)

    assert pair.primary.last_json["prompt"] == ["Say A", "Say B"]
    assert pair.primary.last_json["logprobs"] == 2
    assert len(completion.choices) == 2
    assert completion.choices[0].text.startswith("Say A")
    assert completion.choices[0].logprobs is not None
    validate(completion.model_dump(mode="json", exclude_unset=True), "CreateCompletionResponse")


def test_legacy_completions_stream(pair: Pair) -> None:
    stream = pair.client().completions.create(model="chat-model", prompt="Say", stream=True)

    assert "".join(c.choices[0].text for c in stream if c.choices) == "Hello from primary"


def test_every_answer_says_the_gateway_s_own_time_apart_from_the_upstream_s(pair: Pair) -> None:
    from tests.upstream import slow_first_token

    pair.primary.set_mode(slow_first_token(0.5), slow_first_token(0.5))
    whole = pair.client().chat.completions.with_raw_response.create(
        model="chat-model", messages=MESSAGES, extra_headers={"x-request-id": "overhead-1"})
    with httpx.stream("POST", f"{pair.gateway.base_url}/chat/completions",
                      json={"model": "chat-model", "messages": MESSAGES, "stream": True}) as resp:
        streamed = float(resp.headers["x-llms-overhead-ms"])
        resp.read()
    logged = pair.gateway.request_line("overhead-1")

    # The upstream took half a second to answer each; that half second is not the gateway's.
    overhead = float(whole.headers["x-llms-overhead-ms"])
    assert 0 <= overhead < 500 and 0 <= streamed < 500
    assert logged["overhead_ms"] == round(logged["overhead_ms"], 2) and logged["overhead_ms"] < 500
    assert logged["latency_ms"] >= 500 > logged["overhead_ms"]
