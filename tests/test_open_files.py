"""Started from a shell with a low open-file limit, the gateway still holds many streams.

Each held request costs two descriptors; a soft limit of 1,024 (or less) under a higher hard one
is common, and left there the gateway fails connections with "Too many open files" long before
`server.max_concurrency`. `gateway serve` raises the soft limit to the hard one, and says so at
start when even the hard one carries less than half of `max_concurrency`.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway.edge import openfiles
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, ok

STREAMS = 300
SOFT_LIMIT = 256  # ~120 streams' worth: what the gateway would be stuck with


def _stream_request(port: int) -> bytes:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "stream": True}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (port, len(body), body))


async def _streams_at_once(port: int, count: int) -> collections.Counter[str]:
    """`count` streams at once; how each ended: "done", "503 overloaded", "closed" (the
    connection dropped or timed out unanswered), or the status and error code it got."""
    request = _stream_request(port)

    async def one() -> str:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (OSError, asyncio.IncompleteReadError):
            return "closed"
        status = head.split(b" ", 2)[1].decode()
        if status == "200":
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), 30)
            outcome = "done" if b"data: [DONE]" in answer else "200 cut"
        else:
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            error = json.loads(await reader.readexactly(length))["error"]
            outcome = f"{status} {error['code']}"
        writer.close()
        return outcome

    return collections.Counter(await asyncio.gather(*(one() for _ in range(count))))


def _open_files_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line")


def test_a_gateway_started_with_a_low_soft_limit_still_holds_hundreds_of_streams(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    # This process holds the clients' and the fake upstream's ends: ~4 per stream.
    if (limit := openfiles.raise_limit()) < 4 * STREAMS + 256:
        pytest.skip(f"this machine's hard open-file limit ({limit}) is below the test's needs")
    slow = upstream_factory("slow")
    slow.set_mode(ok(content=" ".join(["word"] * 8), delay_between_chunks=0.15))
    # max_concurrency within what the hard limit carries: nothing to warn about.
    doc = config({"slow": provider(slow.base_url, {"m": "m"})},
                 server={"max_concurrency": STREAMS + 100})
    gateway = start_gateway(doc, open_files=(SOFT_LIMIT, 4 * STREAMS))
    assert gateway.process is not None

    outcomes = asyncio.run(_streams_at_once(gateway.port, STREAMS))

    assert outcomes == {"done": STREAMS}
    assert _open_files_limit(gateway.process.pid) == (4 * STREAMS, 4 * STREAMS)
    assert "open-file limit" not in gateway.logs()


def test_a_hard_limit_short_of_max_concurrency_is_named_at_start(
        start_gateway: Callable[..., GatewayProcess], tmp_path: Path) -> None:
    doc = config({"nowhere": provider("http://127.0.0.1:9/v1", {"m": "m"})})
    gateway = start_gateway(doc, open_files=(256, 512))

    assert ("the open-file limit (512) carries about 128 requests at once, fewer than "
            "server.max_concurrency (10000)") in gateway.logs()


def test_a_burst_past_the_hard_limit_is_told_to_retry_and_the_provider_is_not_blamed(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    slow = upstream_factory("slow")
    slow.set_mode(ok(content=" ".join(["word"] * 8), delay_between_chunks=0.15))
    doc = config({"slow": provider(slow.base_url, {"m": "m"})})
    gateway = start_gateway(doc, open_files=(200, 200))  # nothing to raise to: ~80 streams

    outcomes = asyncio.run(_streams_at_once(gateway.port, 150))
    slow.set_mode(ok())
    after = httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)

    # Past the limit a request is the gateway's to refuse (503, Retry-After), not the
    # provider's failure (502), and the provider's circuit stays closed.
    assert outcomes["done"] > 0 and outcomes["503 overloaded"] > 0, outcomes
    assert set(outcomes) <= {"done", "503 overloaded", "closed"}, outcomes
    assert after.status_code == 200 and after.headers["x-llms-provider"] == "slow"
