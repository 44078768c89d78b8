"""The response cache: identical requests to a cached alias cost one upstream call."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, ok, status

HI = [{"role": "user", "content": "What is the capital of France?"}]
ALICE, BOB = "alice-key-00001", "bob-key-000001"
PRICE = {"input": 1000.0, "output": 1000.0}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="up") as fake:
        yield fake


@pytest.fixture(autouse=True)
def fresh(upstream: FakeUpstream) -> None:
    upstream.reset()


def cached_config(upstream: FakeUpstream, **sections: Any) -> dict[str, Any]:
    return config({"up": provider(upstream.base_url, {
        "cached": {"id": "m", "price": PRICE}, "plain": "m"})},
        models={"cached": {"cache": {"ttl": 60}}}, **sections)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            upstream: FakeUpstream) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("cache"), cached_config(upstream)).start()
    yield process
    process.stop()


def ask(gateway: GatewayProcess, content: str = "Paris?", key: str | None = None,
        **extra: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(extra.pop("headers", {}))
    return httpx.post(f"{gateway.base_url}/chat/completions", headers=headers, json={
        "model": extra.pop("model", "cached"),
        "messages": [{"role": "user", "content": content}], **extra})


def test_three_identical_requests_cost_one_upstream_call(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    first, second, third = (ask(gateway, "three", user=f"u{n}") for n in range(3))
    assert len(upstream.requests) == 1
    assert "x-llms-cache" not in first.headers and float(first.headers["x-llms-cost"]) > 0
    for hit in (second, third):
        assert hit.headers["x-llms-cache"] == "hit"
        assert hit.headers["x-llms-provider"] == "up"
        assert "x-llms-cost" not in hit.headers, "a hit costs nothing"
        assert hit.json() == first.json()


def test_a_streamed_answer_replays_as_the_same_chunks_and_serves_whole_requests_too(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    def stream() -> tuple[bytes, httpx.Headers]:
        with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json={
                "model": "cached", "messages": [{"role": "user", "content": "streamed"}],
                "stream": True}) as answer:
            return answer.read(), answer.headers

    first, _ = stream()
    again, headers = stream()
    whole = ask(gateway, "streamed")
    assert len(upstream.requests) == 1
    assert again == first and headers["x-llms-cache"] == "hit"
    assert again.endswith(b"data: [DONE]\n\n")
    assert whole.headers["x-llms-cache"] == "hit"
    assert whole.json()["choices"][0]["message"]["content"] == "Hello from up"


def test_a_whole_answer_replays_as_a_stream_the_sdk_reads(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    ask(gateway, "whole first")
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="cached", messages=[{"role": "user", "content": "whole first"}], stream=True,
        stream_options={"include_usage": True}))
    assert len(upstream.requests) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "Hello from up"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_no_cache_skips_reading_and_no_store_skips_both(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    ask(gateway, "fresh please", headers={"Cache-Control": "no-store"})
    ask(gateway, "fresh please")  # no-store kept nothing: a miss, kept now
    ask(gateway, "fresh please", headers={"Cache-Control": "no-cache"})
    hit = ask(gateway, "fresh please")
    assert len(upstream.requests) == 3
    assert hit.headers["x-llms-cache"] == "hit"


def test_failures_are_not_kept_and_other_bodies_miss(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    upstream.set_mode(status(500), ok())
    assert ask(gateway, "flaky").status_code == 502
    assert ask(gateway, "flaky").status_code == 200
    assert ask(gateway, "flaky", temperature=0.5).status_code == 200
    assert len(upstream.requests) == 3, "the error was not kept; another temperature misses"
    ask(gateway, "not cached", model="plain")
    ask(gateway, "not cached", model="plain")
    assert len(upstream.requests) == 5, "an alias without cache.ttl is never cached"


def test_metrics_count_hits_misses_and_bytes(gateway: GatewayProcess) -> None:
    ask(gateway, "counted")
    ask(gateway, "counted")
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'llms_cache_lookups_total{model="cached",result="hit"}' in metrics
    assert 'llms_cache_lookups_total{model="cached",result="miss"}' in metrics
    assert 'llms_cache_stored_bytes_total{model="cached"}' in metrics


def test_answers_are_kept_per_key(start_gateway: Callable[..., GatewayProcess],
                                  upstream: FakeUpstream) -> None:
    gateway = start_gateway(cached_config(upstream, server={"api_keys": [ALICE, BOB]}))
    ask(gateway, "mine", key=ALICE)
    bobs = ask(gateway, "mine", key=BOB)
    alices = ask(gateway, "mine", key=ALICE)
    assert "x-llms-cache" not in bobs.headers
    assert alices.headers["x-llms-cache"] == "hit"
    assert len(upstream.requests) == 2


def test_under_global_scope_every_key_is_served_the_same_answer(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    doc = cached_config(upstream, server={"api_keys": [ALICE, BOB]})
    doc["models"]["cached"]["cache"]["scope"] = "global"
    gateway = start_gateway(doc)
    ask(gateway, "ours", key=ALICE)
    bobs = ask(gateway, "ours", key=BOB)
    assert bobs.headers["x-llms-cache"] == "hit"
    assert len(upstream.requests) == 1


@pytest.mark.skipif(not RedisServer.available(), reason="redis-server is not installed")
def test_two_gateways_on_one_redis_share_hits(tmp_path: Path, upstream: FakeUpstream) -> None:
    redis = RedisServer().start()
    doc = cached_config(upstream, state={"backend": "redis", "url": redis.url})
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = GatewayProcess(tmp_path / "one", doc).start()
    two = GatewayProcess(tmp_path / "two", doc).start()
    try:
        ask(one, "shared")
        assert ask(two, "shared").headers["x-llms-cache"] == "hit"
        assert len(upstream.requests) == 1
    finally:
        one.stop()
        two.stop()
        redis.stop()
