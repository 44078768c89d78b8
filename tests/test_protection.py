"""The gateway protects itself and its owner: caps, limits, and no open door by accident."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import Pair
from tests.gateway_process import ROOT, GatewayProcess, config, provider
from tests.upstream import FakeUpstream, ok, slow_first_token
from tests.waiting import wait_until

MESSAGES = [{"role": "user", "content": "hello"}]
BODY = json.dumps({"model": "chat-model", "messages": MESSAGES}).encode()


def read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length body, from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        assert received, "the gateway closed the connection"
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_past_the_concurrency_cap_with_no_queue_clients_get_503_with_retry_after(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    # With a queue (the default) they wait their turn: tests/test_queueing.py.
    slow = upstream_factory("slow")
    slow.set_mode(slow_first_token(1.0))
    gateway = start_gateway(config({"slow": provider(slow.base_url, {"m": "m"})},
                                   server={"max_concurrency": 2, "max_queue": 0}))
    url = f"{gateway.base_url}/chat/completions"
    body = {"model": "m", "messages": MESSAGES}
    held = [threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body})
            for _ in range(2)]
    for thread in held:
        thread.start()
    wait_until(lambda: len(slow.requests) == 2, what="both slots held by the slow upstream")

    refused = httpx.post(url, json=body)

    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "overloaded"
    for thread in held:
        thread.join()
    slow.set_mode(ok())
    assert httpx.post(url, json={**body, "stream": True}).status_code == 200
    assert httpx.get(f"{gateway.url}/ready").json()["inflight"] == 0, "every request counted out"


def test_huge_headers_and_absurd_nesting_are_refused_cleanly(pair: Pair) -> None:
    url = f"{pair.gateway.base_url}/chat/completions"
    headers = {f"x-filler-{i}": "y" * 1000 for i in range(80)}

    too_big = httpx.post(url, json={"model": "chat-model", "messages": MESSAGES},
                         headers=headers)
    nested = httpx.post(url, content=b'{"model": "chat-model", "messages": [{"role": "user", '
                        b'"content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}")

    assert too_big.status_code == 431
    assert too_big.json()["error"]["code"] == "headers_too_large"
    assert nested.status_code == 400
    assert nested.json()["error"]["code"] == "invalid_request"  # content's type, or its depth
    assert pair.primary.requests == []
    assert httpx.get(f"{pair.gateway.url}/health").status_code == 200


def test_binding_beyond_loopback_without_keys_is_refused_unless_asked(tmp_path: Path) -> None:
    path = tmp_path / "llms.json"
    path.write_text('{"providers": {}}')
    command = [sys.executable, "-m", "gateway", "serve", "--config", str(path),
               "--host", "0.0.0.0", "--port", "0"]

    refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)

    assert refused.returncode == 2
    assert "refusing to serve 0.0.0.0 without API keys" in refused.stderr
    assert "--allow-unauthenticated" in refused.stderr


def _answers(gateway: GatewayProcess) -> bool:
    """Whether a new connection is served."""
    try:
        httpx.get(f"{gateway.url}/health", timeout=1)
    except httpx.HTTPError:
        return False
    return True


def test_sigterm_lets_open_streams_finish_then_exits(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    import os
    import signal

    up = upstream_factory("up")
    up.set_mode(ok(content=" ".join(["word"] * 15), delay_between_chunks=0.1))
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))
    assert gateway.process is not None

    with httpx.stream("POST", f"{gateway.base_url}/chat/completions",
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        os.killpg(gateway.process.pid, signal.SIGTERM)
        # Within a second, while the stream has some 1.4 s to go: one that has exited refuses.
        wait_until(lambda: not _answers(gateway), within=1.0,
                   what="no new connections once shutting down")
        rest = [line for line in lines if line]

    assert rest[-1] == "data: [DONE]", "the in-flight stream finished"
    # A graceful shutdown exits 0 (or re-raises SIGTERM, as some servers do for init systems).
    assert gateway.process.wait(timeout=10) in (0, -signal.SIGTERM)


def test_an_idle_connection_outlives_the_clients_own_keep_alive(pair: Pair) -> None:
    """httpx and the OpenAI SDK keep idle connections 5 s; had the gateway closed them at 5 s too,
    a client could send on one just as it closed and see a reset (ReadError)."""
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
               f"Content-Type: application/json\r\n"
               f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY
    with socket.create_connection(("127.0.0.1", pair.gateway.port), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(request)
            assert read_response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(5.5)  # past the clients' 5 s: the same socket must still serve
