"""A response-cache entry in Redis that is not a sound answer (another writer's, a corrupted
one) is a miss, deleted: never served as a hit, never a 500."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from gateway.cache.store import key_of
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream

PREFIX = "llms-gateway:cache:"  # the state backend's default prefix, then the cache's


def _chunks(*events: str) -> bytes:
    return b"".join(b"data: %s\n\n" % e.encode() for e in events)


CHUNK = '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,' \
        '"delta":{"content":"x"}}]}'
END = '{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},' \
      '"finish_reason":"stop"}]}'
BAD: dict[str, dict[str, Any]] = {
    "body-not-json": {"body": b"garbage, not JSON"},
    "body-an-error-object": {"body": b'{"error": {"message": "upstream broke"}}'},
    "body-choices-not-a-list": {"body": b'{"choices": 5}'},
    "body-tool-calls-not-objects": {"body": json.dumps({"choices": [{"index": 0, "message": {
        "role": "assistant", "tool_calls": ["x"]}, "finish_reason": "tool_calls"}]}).encode()},
    "body-not-utf8": {"body": b'{"choices": [], "id": "\xff"}'},
    "chunks-not-sse": {"chunks": b"<html>not events</html>\n\n"},
    "chunks-cut-short": {"chunks": _chunks(CHUNK)},
    "chunks-not-json": {"chunks": _chunks(CHUNK, "{oops", END, "[DONE]")},
    "chunks-an-error-event": {"chunks": _chunks(CHUNK, '{"error": {"message": "x"}}', "[DONE]")},
    "both-forms": {"body": b'{"choices": []}', "chunks": _chunks(CHUNK, END, "[DONE]")},
    "no-form": {},
    "another-endpoint": {"endpoint": "embeddings", "body": b'{"choices": []}'},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[GatewayProcess, FakeUpstream, redis.Redis]]:
    if not RedisServer.available():
        pytest.skip("redis-server not installed")
    server = RedisServer().start()
    with FakeUpstream(name="up") as upstream:
        gateway = GatewayProcess(tmp_path_factory.mktemp("entries"), config(
            {"up": provider(upstream.base_url, {"cached": "m"})},
            models={"cached": {"cache": {"ttl": 60}}},
            state={"backend": "redis", "url": server.url})).start()
        client = redis.Redis.from_url(server.url)
        try:
            yield gateway, upstream, client
        finally:
            client.close()
            gateway.stop()
            server.stop()


def _plant(client: redis.Redis, content: str, entry: dict[str, Any]) -> str:
    """Write `entry` where the gateway will look for this request's answer; the Redis key."""
    body = {"model": "cached", "messages": [{"role": "user", "content": content}]}
    key = PREFIX + key_of("chat/completions", "cached", body, None)
    fields: dict[str, Any] = {"endpoint": "chat/completions", "provider": "up",
                              "expires": time.time() + 60}
    for name, value in entry.items():
        fields[name] = base64.b64encode(value).decode() if isinstance(value, bytes) else value
    client.set(key, json.dumps(fields).encode())
    return key


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", list(BAD))
def test_an_unsound_entry_is_a_miss_and_is_replaced(
        setup: tuple[GatewayProcess, FakeUpstream, redis.Redis], case: str, stream: bool) -> None:
    gateway, upstream, client = setup
    content = f"{case} {stream}"
    key = _plant(client, content, BAD[case])
    upstream.reset()

    response = httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": "cached", "messages": [{"role": "user", "content": content}],
        "stream": stream}, timeout=30)

    assert response.status_code == 200, response.text
    assert response.headers.get("x-llms-cache") != "hit", response.text
    assert len(upstream.requests) == 1
    if stream:
        assert response.text.rstrip().endswith("data: [DONE]")
        assert "Hello" in response.text
    else:
        assert response.json()["choices"][0]["message"]["content"].startswith("Hello")
    form, other = ("chunks", "body") if stream else ("body", "chunks")

    def replaced() -> bool:  # a stream is kept once its last chunk went out
        kept = json.loads(client.get(key) or b"{}")
        return bool(kept.get(form)) and not kept.get(other)

    wait_until(replaced)
