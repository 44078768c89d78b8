"""What upstream answers may look like: compressed every common way, or too big to hold.

Upstreams here are raw servers (`scripted`) writing exactly the bytes a test gives them; the
gateway is the real process. An answer the gateway cannot take fails over (`bad_response`) to
the next provider, a real fake that answers.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import brotli
import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, Reply, ok

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "packed " * 200},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 200, "total_tokens": 201}}).encode()
MiB = 1024 * 1024


def _ask(gateway: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", json=CHAT, timeout=30)


def _answer(body: bytes, encoding: str | None = None, length: int | None = None) -> Reply:
    """Reply with `body` (already encoded), its Content-Encoding and Content-Length."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + (b"Content-Encoding: %s\r\n" % encoding.encode() if encoding else b"")
            + b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length))
    return lambda transport, request, nth: transport.write(head + body)


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # no zlib header: what IIS sends
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(("encoding", "pack"), [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", _raw_deflate),
    ("br", brotli.compress),
], ids=["gzip", "deflate-zlib", "deflate-raw", "br"])
def test_a_compressed_answer_is_decoded_not_counted_as_a_failure(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]],
        encoding: str, pack: Callable[[bytes], bytes]) -> None:
    base_url, _ = scripted(_answer(pack(COMPLETION), encoding))
    gateway = start_gateway(config({"packed": provider(base_url, {"m": "m"})}))

    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "packed"
    assert answer.json()["choices"][0]["message"]["content"] == "packed " * 200


def test_an_answer_without_a_length_ends_when_the_upstream_closes_and_arrives_whole(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]]) -> None:
    def old_style(transport: asyncio.Transport, body: bytes, n: int) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\n\r\n" + COMPLETION)
        transport.close()

    base_url, counts = scripted(old_style)
    gateway = start_gateway(config({"up": provider(base_url, {"m": "m"})}))

    answers = [_ask(gateway) for _ in range(3)]

    assert [a.status_code for a in answers] == [200] * 3
    assert all(a.json()["usage"]["total_tokens"] == 201 for a in answers)
    assert counts["connections"] == 3, "a closed connection is never reused"


@functools.cache
def _gzip_bomb(inflated: int = 200 * MiB) -> bytes:
    """A gzip body of a few hundred KB that inflates to `inflated` bytes of zeros."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MiB)
    return b"".join(packer.compress(zeros) for _ in range(inflated // MiB)) + packer.flush()


def _memory(pid: int, field: str) -> int:
    """A process's `VmRSS` (resident now) or `VmHWM` (its peak), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} line")


def _reset_peak(pid: int) -> int:
    """Start the peak over from what the process holds now (Linux: clear_refs "5"); that."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _memory(pid, "VmRSS")


def test_a_gzip_bomb_fails_over_in_bounded_memory(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]],
        secondary: FakeUpstream) -> None:
    secondary.reset()
    bomb = _gzip_bomb()
    assert len(bomb) < 300 * 1024
    base_url, _ = scripted(_answer(bomb, "gzip"))
    gateway = start_gateway(config({"bomb": provider(base_url, {"m": "m"}),
                                    "sane": provider(secondary.base_url, {"m": "m"})}))
    assert gateway.process is not None
    assert _ask(gateway).status_code == 200  # warmed up: what any first request allocates
    # Start-up's own peak (imports) would hide the bomb's: the peak starts over here.
    before = _reset_peak(gateway.process.pid)

    answer = _ask(gateway)

    grown = _memory(gateway.process.pid, "VmHWM") - before
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "sane"
    assert gateway.wait_for_log("request", 2)[-1]["failed"] == ["bomb:bad_response"]
    # At most the default max_answer_bytes (64 MiB) held, plus the library's buffers.
    assert grown < 96 * MiB, f"peak RSS grew {grown / MiB:.0f} MiB for a 200 MiB bomb"


def test_an_answer_over_max_answer_bytes_fails_over(
        start_gateway: Callable[..., GatewayProcess], primary: FakeUpstream,
        secondary: FakeUpstream) -> None:
    primary.reset()
    secondary.reset()
    primary.set_mode(ok(content="word " * 2000))  # ~10 KB of JSON
    doc = config({"chatty": provider(primary.base_url, {"m": "m"}, max_answer_bytes=4096),
                  "terse": provider(secondary.base_url, {"m": "m"})})
    gateway = start_gateway(doc)

    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "terse"
    assert gateway.wait_for_log("request")[-1]["failed"] == ["chatty:bad_response"]


def test_a_declared_length_over_the_limit_fails_at_once_without_reading_it(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]],
        secondary: FakeUpstream) -> None:
    secondary.reset()
    # Says 1 GiB, sends a few bytes and holds the connection: reading on would wait for total.
    base_url, _ = scripted(_answer(b'{"id": "', length=1024 * MiB))
    doc = config({"huge": provider(base_url, {"m": "m"}),
                  "sane": provider(secondary.base_url, {"m": "m"})},
                 defaults={"max_answer_bytes": 8 * MiB})
    gateway = start_gateway(doc)

    started = time.monotonic()
    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "sane"
    assert time.monotonic() - started < 3, "failed when the head arrived, not at a timeout"
    attempt_log = gateway.wait_for_log("request")[-1]
    assert attempt_log["failed"] == ["huge:bad_response"]
