"""`Idempotency-Key`: a client's retry is answered by the request it repeats, and the upstream
generates (and bills) the answer once."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.idempotency.store import IdempotencyStore, Remembered, digest_of, key_of
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, ok, slow_first_token, status, stream_cut

PRICE = {"input": 1000.0, "output": 1000.0}
ALICE, BOB = "alice-key-00001", "bob-key-000001"
WORDS = [f" w{n}" for n in range(12)]


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="up") as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh(upstream: FakeUpstream) -> None:
    upstream.reset()


def doc(upstream: FakeUpstream, **sections: Any) -> dict[str, Any]:
    return config({"up": provider(upstream.base_url, {"m": {"id": "m", "price": PRICE},
                                                      "embed": "e"})}, **sections)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            upstream: FakeUpstream) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("idem"), doc(upstream)).start()
    yield process
    process.stop()


def new_key() -> str:
    return f"retry-{uuid.uuid4().hex}"


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def post(gateway: GatewayProcess, key: str | None, body: dict[str, Any],
         path: str = "chat/completions", client_key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    if client_key is not None:
        headers["Authorization"] = f"Bearer {client_key}"
    return httpx.post(f"{gateway.base_url}/{path}", json=body, headers=headers, timeout=30)


def sent(gateway: GatewayProcess, key: str, body: dict[str, Any]) -> socket.socket:
    """A request sent on a raw connection, its answer left to read (`Connection: close`)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\nIdempotency-Key: %s\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                 % (key.encode(), len(data), data))
    return sock


def left_mid_wait(gateway: GatewayProcess, upstream: FakeUpstream, key: str,
                  body: dict[str, Any]) -> None:
    """Send a request, and drop the connection once the upstream has it."""
    with sent(gateway, key, body):
        wait_until(lambda: len(upstream.requests) == 1)


def inflight(gateway: GatewayProcess) -> float:
    metrics = httpx.get(f"{gateway.url}/metrics").text
    return float(next(line.split()[1] for line in metrics.splitlines()
                      if line.startswith("llms_inflight_requests ")))


def test_a_whole_request_retried_after_its_client_left_gets_the_answer_of_one_upstream_call(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    upstream.set_mode(slow_first_token(1.0, ok("the one answer")))
    key, body = new_key(), chat("slow")
    left_mid_wait(gateway, upstream, key, body)

    retried = post(gateway, key, body)
    again = post(gateway, key, body)

    assert retried.status_code == 200, retried.text
    assert retried.json()["choices"][0]["message"]["content"] == "the one answer"
    assert retried.headers["x-llms-idempotent-replay"] == "true"
    assert again.content == retried.content
    assert len(upstream.requests) == 1 and upstream.cancelled == 0


def test_a_stream_retried_mid_way_gets_the_whole_stream_byte_for_byte(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    upstream.set_mode(ok(chunks=WORDS, delay_between_chunks=0.1))
    key, body = new_key(), chat("stream", stream=True)
    headers = {"Idempotency-Key": key}
    url = f"{gateway.base_url}/chat/completions"
    seen = b""
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as first:
        for piece in first.iter_raw():
            seen += piece
            if seen.count(b"data: ") >= 3:
                break  # the client leaves mid-way

    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as second:
        joined = second.read()
        assert second.headers["x-llms-idempotent-replay"] == "true"
    replayed = post(gateway, key, body)

    assert joined.startswith(seen[:seen.rindex(b"\n\n") + 2])
    assert joined.endswith(b"data: [DONE]\n\n")
    events = [json.loads(line[6:]) for line in joined.split(b"\n\n")
              if line.startswith(b"data: {")]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if e["choices"]) == "".join(WORDS)
    assert replayed.content == joined, "a replay after the end is the same bytes"
    assert len(upstream.requests) == 1 and upstream.cancelled == 0


def test_the_same_key_with_another_body_is_a_422_naming_the_header(
        gateway: GatewayProcess) -> None:
    key = new_key()
    assert post(gateway, key, chat("one")).status_code == 200

    other = post(gateway, key, chat("two"))

    assert other.status_code == 422
    error = other.json()["error"]
    assert error["param"] == "Idempotency-Key" and error["code"] == "idempotency_key_reused"
    assert error["type"] == "invalid_request_error"


def test_on_messages_the_422_is_in_anthropics_shape(gateway: GatewayProcess) -> None:
    key = new_key()
    ask = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    first = post(gateway, key, ask, "messages")
    replayed = post(gateway, key, ask, "messages")
    other = post(gateway, key, {**ask, "max_tokens": 21}, "messages")

    assert first.status_code == 200, first.text
    assert replayed.headers["x-llms-idempotent-replay"] == "true"
    assert replayed.content == first.content
    assert other.status_code == 422
    assert other.json()["type"] == "error"
    assert other.json()["error"]["type"] == "invalid_request_error"
    assert "Idempotency-Key" in other.json()["error"]["message"]


def test_a_key_too_long_is_a_400_naming_the_header(gateway: GatewayProcess,
                                                   upstream: FakeUpstream) -> None:
    refused = post(gateway, "k" * 256, chat())

    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "Idempotency-Key"
    assert not upstream.requests


def test_usage_and_cost_are_counted_once(gateway: GatewayProcess,
                                         upstream: FakeUpstream) -> None:
    key, body = new_key(), chat("priced")
    first = post(gateway, key, body)
    replayed = post(gateway, key, body)

    ids = {first.headers["x-request-id"], replayed.headers["x-request-id"]}
    wait_until(lambda: len([e for e in gateway.log_events("request")
                            if e["request_id"] in ids]) == 2)
    lines = {e["request_id"]: e for e in gateway.log_events("request")
             if e["request_id"] in ids}
    original, replay = lines[first.headers["x-request-id"]], \
        lines[replayed.headers["x-request-id"]]
    assert original["tokens"] > 0 and original["cost"] > 0
    assert replay["tokens"] is None and replay["cost"] is None
    assert replay["provider"] == "replay" and replay["idempotent"] == "replay"
    assert "x-llms-cost" not in replayed.headers and "x-llms-attempts" not in replayed.headers
    assert len(upstream.requests) == 1


def test_failures_are_not_remembered(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    key, body = new_key(), chat("fails")
    upstream.set_mode(status(400, "bad"), ok("second time lucky"))
    assert post(gateway, key, body).status_code == 400

    retried = post(gateway, key, body)

    assert retried.status_code == 200
    assert "x-llms-idempotent-replay" not in retried.headers
    assert len(upstream.requests) == 2


def test_a_stream_cut_mid_way_is_not_remembered(gateway: GatewayProcess,
                                               upstream: FakeUpstream) -> None:
    key, body = new_key(), chat("cut", stream=True)
    upstream.set_mode(stream_cut(after_chunks=2), ok())
    cut = post(gateway, key, body)
    assert b'"error"' in cut.content and b"[DONE]" not in cut.content

    retried = post(gateway, key, body)

    assert retried.content.endswith(b"data: [DONE]\n\n")
    assert "x-llms-idempotent-replay" not in retried.headers
    assert len(upstream.requests) == 2


def test_embeddings_completions_and_responses_are_replayed(gateway: GatewayProcess,
                                                           upstream: FakeUpstream) -> None:
    for path, body in (("embeddings", {"model": "embed", "input": ["a", "b"]}),
                       ("completions", {"model": "m", "prompt": "once"}),
                       ("responses", {"model": "m", "input": "once"})):
        key = new_key()
        first = post(gateway, key, body, path)
        replayed = post(gateway, key, body, path)
        assert first.status_code == 200, first.text
        assert replayed.headers["x-llms-idempotent-replay"] == "true"
        assert replayed.content == first.content
    assert len(upstream.requests) == 3


def test_an_answer_past_the_entry_bound_is_not_remembered(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(doc(upstream, idempotency={"max_entry_bytes": 64}))
    key, body = new_key(), chat("too long to keep")

    first, again = post(gateway, key, body), post(gateway, key, body)

    assert first.status_code == again.status_code == 200
    assert "x-llms-idempotent-replay" not in again.headers
    assert len(upstream.requests) == 2


def test_another_client_key_never_gets_the_first_keys_answer(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(doc(upstream, server={"api_keys": [ALICE, BOB]}))
    key, body = new_key(), chat("mine")
    upstream.set_mode(ok("for alice"), ok("for bob"))
    post(gateway, key, body, client_key=ALICE)

    bobs = post(gateway, key, body, client_key=BOB)
    alices = post(gateway, key, body, client_key=ALICE)

    assert bobs.json()["choices"][0]["message"]["content"] == "for bob"
    assert "x-llms-idempotent-replay" not in bobs.headers
    assert alices.json()["choices"][0]["message"]["content"] == "for alice"
    assert alices.headers["x-llms-idempotent-replay"] == "true"
    assert len(upstream.requests) == 2


def test_two_gateways_on_one_redis_share_the_memory(
        tmp_path: Path, upstream: FakeUpstream, redis_server: RedisServer) -> None:
    shared = doc(upstream, state={"backend": "redis", "url": redis_server.url})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = GatewayProcess(tmp_path / "one", shared).start()
    two = GatewayProcess(tmp_path / "two", shared).start()
    try:
        key = new_key()
        first = post(one, key, chat("shared"))
        elsewhere = post(two, key, chat("shared"))
        other = post(two, key, chat("not the same"))
    finally:
        one.stop()
        two.stop()

    assert elsewhere.headers["x-llms-idempotent-replay"] == "true"
    assert elsewhere.content == first.content
    assert other.status_code == 422
    assert len(upstream.requests) == 1


def test_the_openai_sdk_gets_the_replay(gateway: GatewayProcess,
                                        upstream: FakeUpstream) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    key = new_key()

    def ask() -> Any:
        return client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "sdk"}],
            extra_headers={"Idempotency-Key": key})

    first, replayed = ask(), ask()

    assert replayed.headers["x-llms-idempotent-replay"] == "true"
    assert replayed.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert len(upstream.requests) == 1


def test_an_answer_is_forgotten_after_its_ttl() -> None:
    now = [1000.0]
    store = IdempotencyStore(1024 * 1024, 1024, clock=lambda: now[0])
    entry = Remembered("digest", now[0] + 60, "application/json", b"{}")

    async def story() -> tuple[Remembered | None, Remembered | None, bool]:
        assert await store.put("key", entry)
        kept = await store.get("key")
        now[0] += 60
        gone = await store.get("key")
        too_large = await store.put("big", Remembered("d", now[0] + 60, "x", b"x" * 2048))
        return kept, gone, too_large

    kept, gone, too_large = asyncio.run(story())

    assert kept == entry and gone is None
    assert not too_large, "an answer past the entry bound is not remembered"


def test_retries_waiting_on_a_running_request_are_bounded_and_it_keeps_its_slot(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(doc(upstream, idempotency={"max_waiters": 1}))
    upstream.set_mode(slow_first_token(2.0, ok("worth the wait")))
    key, body = new_key(), chat("waited on")
    left_mid_wait(gateway, upstream, key, body)
    wait_until(lambda: inflight(gateway) == 1)  # the flight whose client left still counts

    with sent(gateway, key, body) as waiting:
        wait_until(lambda: inflight(gateway) == 2)
        refused = post(gateway, key, body)
        answer = b""
        while piece := waiting.recv(65536):
            answer += piece

    assert refused.status_code == 409
    assert refused.json()["error"]["param"] == "Idempotency-Key"
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"x-llms-idempotent-replay: true" in head
    assert json.loads(payload)["choices"][0]["message"]["content"] == "worth the wait"
    wait_until(lambda: inflight(gateway) == 0)
    assert len(upstream.requests) == 1


def test_the_same_request_from_another_client_library_matches_and_scopes_stay_apart() -> None:
    assert digest_of(b'{"model": "m", "n": 1}') == digest_of(b'{"n":1,"model":"m"}')
    assert digest_of(b'{"model": "m", "n": 1}') != digest_of(b'{"model": "m", "n": 2}')
    assert key_of("alice", "chat/completions", "k") != key_of("bob", "chat/completions", "k")
    assert key_of("alice", "chat/completions", "k") != key_of("alice", "embeddings", "k")
