"""A chunked body the server cannot read is the client's error: a 400 in the envelope, logged
and counted as a 400, never a plain-text 500 counted as a client that left."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
MALFORMED = {
    "size-not-hex": b"zz\r\n%s\r\n0\r\n\r\n" % BODY,
    "size-overflows": b"ffffffffffffffffffff\r\n%s\r\n0\r\n\r\n" % BODY,
    "no-crlf-after-data": b"%x\r\n%sXX0\r\n\r\n" % (len(BODY), BODY),
    "huge-extension": b"%x;%s\r\n%s\r\n0\r\n\r\n" % (len(BODY), b"e" * 200_000, BODY),
    # Each extension small, together past what the server reads of them.
    "many-extensions": b"".join(b"1;%s\r\n%s\r\n" % (b"e" * 1000, BODY[n:n + 1])
                                for n in range(len(BODY))) + b"0\r\n\r\n",
    "huge-trailer": b"%x\r\n%s\r\n0\r\nX-Trailer: %s\r\n\r\n" % (len(BODY), BODY,
                                                                   b"t" * 200_000),
}


def _exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `raw` after a chunked request head; the status, headers and body answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(HEAD)
        # The server may stop reading once the framing is wrong: its answer is what matters.
        with contextlib.suppress(OSError):
            sock.sendall(raw)
        received = b""
        while b"\r\n\r\n" not in received:
            if not (data := sock.recv(65536)):
                break
            received += data
        head, _, body = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        while len(body) < int(headers.get("content-length", "0")):
            if not (data := sock.recv(65536)):
                break
            body += data
    return int(lines[0].split()[1]), headers, body


@pytest.fixture
def gateway(start_gateway: Callable[..., GatewayProcess]
            ) -> Iterator[tuple[GatewayProcess, FakeUpstream]]:
    upstream = FakeUpstream(name="oa").start()
    try:
        yield start_gateway(config({"oa": provider(upstream.base_url, {"m": "m"})})), upstream
    finally:
        upstream.stop()


def test_a_well_formed_chunked_body_is_served(
        gateway: tuple[GatewayProcess, FakeUpstream]) -> None:
    process, _ = gateway

    status, _, _ = _exchange(process.port, b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))

    assert status == 200


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_chunked_body_is_a_400_in_the_envelope_counted_as_one(
        gateway: tuple[GatewayProcess, FakeUpstream], case: str) -> None:
    process, upstream = gateway

    status, headers, body = _exchange(process.port, MALFORMED[case])

    assert status == 400, body
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "invalid_request"
    assert upstream.requests == []
    logged = process.wait_for_log("request")[-1]
    assert (logged["status"], logged["outcome"]) == (400, "error")
    counted = [line for line in httpx.get(f"{process.url}/metrics").text.splitlines()
               if line.startswith("llms_requests_total{")]
    assert any('status="400"' in line for line in counted), counted
    assert not any('status="499"' in line or 'status="500"' in line for line in counted), counted
