"""What workers and replicas share: a gateway is one gateway, however many processes serve it.

The first key made on one worker closes every worker before the admin's answer is back; a retry
with the same `Idempotency-Key` on another replica waits for the first's answer instead of
running (and billing) it again; a key's parallel slot held by a process that was killed is free
again within its lease, while a slot whose request still runs is kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hello"}]


def chat(gateway: GatewayProcess, key: str | None = None, **extra: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=20) as client:  # a connection of its own: any worker may take it
        return client.post(f"{gateway.base_url}/chat/completions", headers=headers,
                           json={"model": "m", "messages": MESSAGES, **extra})


def pids(gateway: GatewayProcess, status: int) -> set[int]:
    """The workers that answered some request with `status`, by the request log."""
    return {line["pid"] for line in gateway.log_events("request") if line["status"] == status}


@contextlib.contextmanager
def running(*gateways: GatewayProcess) -> Iterator[None]:
    """The gateways started (several workers take a while), stopped however the story ends."""
    try:
        for gateway in gateways:
            gateway.start(timeout=60)
        yield
    finally:
        for gateway in gateways:
            gateway.stop()


def test_the_first_key_made_on_one_worker_closes_every_worker_at_once(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("billing")
    # Workers read the directory again only every 5 s: nothing but the request itself can
    # tell a worker that did not make the key that one exists.
    doc = config({"main": provider(upstream.base_url, {"m": "m"})},
                 database={"poll_interval": 5})
    gateway = GatewayProcess(tmp_path, doc, extra_args=("--workers", "2"))
    with running(gateway):
        story_of_the_first_key(gateway, upstream)


def story_of_the_first_key(gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    wait_until(lambda: chat(gateway).status_code == 200 and len(pids(gateway, 200)) == 2,
               within=30, what="both workers serving without keys")
    served = len(upstream.requests)

    made = httpx.post(f"{gateway.url}/admin/keys", json={"name": "first"}, timeout=10)
    assert made.status_code == 201, made.text
    answers = [chat(gateway).status_code for _ in range(30)]

    assert answers == [401] * 30, "no request without a key is served once the admin has one"
    assert len(upstream.requests) == served, "nothing went upstream uncharged"
    wait_until(lambda: len(pids(gateway, 401)) == 2, what="both workers refusing")
    assert chat(gateway, made.json()["key"]).status_code == 200
