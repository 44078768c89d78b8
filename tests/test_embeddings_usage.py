"""An embeddings answer whose usage no upstream could honestly count (negative, past 2**53,
or split batches adding up past it) is a bad answer: the next provider serves the request, and
the absurd count never reaches the client nor the key's token spend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.minutes import within_one_minute
from tests.upstream import FakeUpstream, Reply

KEY = "key-for-team-e"
DOCS = ["one", "two", "three"]


def answering(tokens: int) -> Reply:
    """A raw upstream embedding every input it is sent, reporting `tokens` for each call."""
    def reply(transport: asyncio.Transport, body: bytes, nth: int) -> None:
        given = json.loads(body)["input"]
        inputs = [given] if isinstance(given, str) else given
        payload = json.dumps({"object": "list", "model": "e", "data": [
            {"object": "embedding", "index": n, "embedding": [0.5, 0.5]}
            for n in range(len(inputs))],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}).encode()
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(payload), payload))
        transport.close()  # nothing left open when the test's server stops
    return reply


@pytest.mark.parametrize(("tokens", "batch"), [
    (-5, None), (2**60, None),
    (2**52, 1),  # each part in bounds, three of them past 2**53
    (2**62, 1),  # the sum was past 64 bits
], ids=["negative", "past-2**53", "split-sum-past-2**53", "split-sum-past-64-bits"])
def test_an_absurd_usage_fails_over_and_is_never_spent(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]],
        upstream_factory: Callable[[str], FakeUpstream], tokens: int, batch: int | None) -> None:
    url, counts = scripted(answering(tokens))
    good = upstream_factory("good")
    lying: dict[str, Any] = provider(url, {"embed": "e"})
    if batch is not None:
        lying["max_embedding_batch"] = batch
    gateway = start_gateway(config(
        {"lying": lying, "good": provider(good.base_url, {"embed": "e"})},
        server={"api_keys": [{"key": KEY, "id": "team-e", "tokens_per_minute": 1000}]},
        defaults={"circuit": {"enabled": False}}))

    def story() -> None:  # in one minute: a count spent is still there for `again`
        response = httpx.post(f"{gateway.base_url}/embeddings",
                              json={"model": "embed", "input": DOCS},
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=30)

        assert response.status_code == 200, response.text
        assert counts["requests"] >= 1
        assert response.headers["x-llms-provider"] == "good"
        usage = response.json()["usage"]
        assert 0 <= usage["prompt_tokens"] < 1000 and 0 <= usage["total_tokens"] < 1000
        again = httpx.post(f"{gateway.base_url}/embeddings", json={"model": "embed", "input": "x"},
                           headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert again.status_code == 200, "the absurd count was spent from the key's tokens"

    within_one_minute(story)
