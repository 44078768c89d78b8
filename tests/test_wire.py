"""The gateway's own HTTP/1.1 client (`providers.wire`): what real upstreams do to it.

Upstreams here are raw asyncio servers that write exactly the bytes a test gives them: a TLS
API, a server that compresses although asked not to, one that ends its answer by closing the
connection, one that talks out of turn on an idle connection.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from providers import wire
from providers.contract.errors import BadUpstreamResponse
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, Reply

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "over the wire"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}}).encode()

def _ask(gateway: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", json=CHAT, timeout=10)


def test_an_upstream_that_gzips_although_asked_not_to_is_still_understood(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]]) -> None:
    packed = gzip.compress(COMPLETION)
    base_url, _ = scripted(lambda t, body, n: t.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(packed), packed)))
    gateway = start_gateway(config({"up": provider(base_url, {"m": "m"})}))

    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "over the wire"


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
    assert all(a.json()["usage"]["total_tokens"] == 4 for a in answers)
    assert counts["connections"] == 3, "a closed connection is never reused"


def test_an_upstream_talking_out_of_turn_on_an_idle_connection_costs_the_next_request_nothing(
        start_gateway: Callable[..., GatewayProcess],
        scripted: Callable[[Reply], tuple[str, dict[str, int]]]) -> None:
    def chatty(transport: asyncio.Transport, body: bytes, n: int) -> None:
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION))
        asyncio.get_running_loop().call_later(0.05, transport.write, b"HTTP/1.1 200 OK\r\n")

    base_url, counts = scripted(chatty)
    gateway = start_gateway(config({"up": provider(base_url, {"m": "m"})}))

    first = _ask(gateway)
    threading.Event().wait(0.3)  # the stray bytes arrive while the connection is idle
    second = _ask(gateway)

    assert (first.status_code, second.status_code) == (200, 200), second.text
    assert counts["connections"] == 2, "the connection that misspoke was dropped"


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_a_tls_upstream_is_verified_against_the_trust_store(
        start_gateway: Callable[..., GatewayProcess], tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with FakeUpstream(name="tls", tls=context) as secure:
        assert secure.base_url.startswith("https://localhost:")
        doc = config({"secure": provider(secure.base_url, {"m": "m"})})
        trusting = start_gateway(doc, env={"SSL_CERT_FILE": str(cert)})
        served = _ask(trusting)
        untrusting = start_gateway(doc)  # the system's store does not know this certificate
        refused = _ask(untrusting)

    assert served.status_code == 200 and served.headers["x-llms-provider"] == "secure"
    assert served.json()["choices"][0]["message"]["content"] == "Hello from tls"
    assert secure.requests[0].headers["authorization"] == "Bearer sk-test-secret-123456"
    assert refused.status_code == 502
    attempt = refused.json()["error"]["attempts"][0]
    assert attempt["reason"] == "unavailable"
    assert "TLS handshake failed" in attempt["message"]
    assert "CERTIFICATE_VERIFY_FAILED" in attempt["message"]


def test_header_values_that_could_split_a_request_are_refused() -> None:
    with pytest.raises(ValueError, match="forbidden character"):
        wire.header_block({"X-Team": "a\r\nX-Injected: 1"})
    assert wire.header_block({"X-Team": "a"}) == b"X-Team: a\r\n"


def test_urls_become_origins_and_request_targets() -> None:
    assert wire.target("https://api.example.com/v1/chat/completions") == wire.Target(
        True, "api.example.com", 443, b"/v1/chat/completions", b"api.example.com", literal=False)
    assert wire.target("http://127.0.0.1:8001/v1/models?pageSize=10") == wire.Target(
        False, "127.0.0.1", 8001, b"/v1/models?pageSize=10", b"127.0.0.1:8001", literal=True)
    ipv6 = wire.target("http://[::1]:9000/v1")
    assert (ipv6.host_header, ipv6.literal) == (b"[::1]:9000", True)
    with pytest.raises(ValueError):
        wire.target("ftp://example.com/")


class _Transport:
    """Enough of a transport for one connection: records pausing."""

    def __init__(self) -> None:
        self.paused = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_a_stream_nobody_reads_stops_being_read_from_the_upstream_until_it_is() -> None:
    async def scenario() -> tuple[bool, bool, int]:
        pool = wire.Pool(wire.target("http://127.0.0.1:9/v1"), None)
        conn = wire.Connection(pool)
        transport = _Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n")
        response = await conn.head
        piece = b"data: " + b"x" * 4090 + b"\n\n"
        for _ in range(wire.HIGH_WATER // len(piece) + 2):
            conn.data_received(b"%x\r\n%s\r\n" % (len(piece), piece))
        paused_when_full = transport.paused
        drained = await response.readany()
        return paused_when_full, transport.paused, len(drained)

    paused_when_full, paused_after, drained = asyncio.run(scenario())

    assert paused_when_full, "past the high-water mark the upstream socket is paused"
    assert not paused_after and drained > wire.HIGH_WATER, "reading resumes it"


def test_a_finished_answer_cannot_reach_the_request_its_connection_carries_next() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        pool = wire.Pool(wire.target("http://127.0.0.1:9/v1"), None)
        conn = wire.Connection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        first = await conn.head
        assert await first.read() == b"ok"
        first.close()
        reused = await pool.acquire(1.0) is conn
        # A stream's watchdog firing late, or a second close, must not fail the next request.
        first.set_exception(TimeoutError())
        first.close()
        return reused, conn.error is None, conn.transport is not None

    assert asyncio.run(scenario()) == (True, True, True)


def test_an_answer_whose_head_never_ends_is_refused_not_buffered() -> None:
    async def scenario() -> str:
        pool = wire.Pool(wire.target("http://127.0.0.1:9/v1"), None)
        conn = wire.Connection(pool)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Filler: " + b"y" * 1000 + b"\r\n"
        while not conn.head.done():
            conn.data_received(line)
        with pytest.raises(BadUpstreamResponse) as caught:
            await conn.head
        return str(caught.value)

    assert "response head larger than" in asyncio.run(scenario())
