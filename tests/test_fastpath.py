"""The relay's one-write answer, against a real uvicorn: `fastpath.write_to_uvicorn` reaches into
uvicorn's connection cycle, so these tests pin that coupling (an upgrade that breaks it fails
here instead of silently costing throughput)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gateway.fastpath import stream_to_uvicorn, write_to_uvicorn
from gateway.relay import StreamAnswer
from tests.gateway_process import ROOT, config, free_port, provider
from tests.upstream import FakeUpstream


class _App:
    """Answers every request with one direct write (`/stream`: a direct stream of three
    chunks), and remembers whether the direct path was taken."""

    def __init__(self) -> None:
        self.direct: list[bool] = []
        self.background_ran = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/stream":
            async def chunks() -> AsyncGenerator[bytes, None]:
                for word in (b"one", b"two", b"three"):
                    yield b"data: %s\n\n" % word

            async def after() -> None:
                self.background_ran += 1

            stream = StreamAnswer(chunks(), {"x-request-id": "r1"}, after)
            self.direct.append(await stream_to_uvicorn(stream, receive, send))
            return
        body = b'{"n":%d}' % len(self.direct)
        self.direct.append(write_to_uvicorn(
            send, 200, [(b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())], body))


@pytest.fixture
def server() -> Iterator[tuple[int, _App]]:
    app, port = _App(), free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", loop="asyncio",
                            lifespan="off", log_level="warning")
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield port, app
    running.should_exit = True
    thread.join(timeout=10)


def _recorded(app: _App, count: int) -> list[bool]:
    """The app's record once it has `count` entries: it appends after its write returns, which
    can be after the client already read the answer."""
    deadline = time.monotonic() + 5
    while len(app.direct) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return app.direct


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_answers_go_out_in_one_write_and_the_connection_stays_usable(
        server: tuple[int, _App]) -> None:
    port, app = server
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
               b"Content-Type: application/json\r\n\r\n{}")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        first = _read_response(sock)
        sock.sendall(request)  # same connection: uvicorn must be ready for the next request
        second = _read_response(sock)

    assert _recorded(app, 2) == [True, True], "uvicorn's cycle was not recognised"
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-type: application/json\r\n" in first
    assert b"date: " in first, "uvicorn's default headers are kept"
    assert first.endswith(b'{"n":0}') and second.endswith(b'{"n":1}')


def test_a_client_that_closes_after_its_request_is_answered_and_closed(
        server: tuple[int, _App]) -> None:
    port, app = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Length: 0\r\n\r\n")
        answer = _read_response(sock)
        assert sock.recv(1) == b"", "the gateway closes a connection: close exchange"

    assert _recorded(app, 1) == [True]
    assert b"connection: close\r\n" in answer


def test_a_stream_goes_out_chunk_by_chunk_and_ends_properly(server: tuple[int, _App]) -> None:
    port, app = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += sock.recv(65536)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        after = _read_response(sock)  # the connection is reusable after the stream

    head, _, body = data.partition(b"\r\n\r\n")
    assert _recorded(app, 2) == [True, True] and app.background_ran == 1
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked" in head and b"x-request-id: r1" in head
    assert body == (b"b\r\ndata: one\n\n\r\nb\r\ndata: two\n\n\r\n"
                    b"d\r\ndata: three\n\n\r\n0\r\n\r\n")
    assert after.endswith(b'{"n":1}')


def test_under_another_asgi_server_the_relay_answers_through_litestar(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    path = tmp_path / "llms.json"
    path.write_text(json.dumps(config({"up": provider(up.base_url, {"m": "m"})})))

    ran = subprocess.run([sys.executable, "-m", "tests.asgi_fallback", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)

    assert ran.returncode == 0, ran.stderr
    whole, streamed = json.loads(ran.stdout)
    assert whole["status"] == 200 and whole["headers"]["x-llms-provider"] == "up"
    assert json.loads(whole["text"])["choices"][0]["message"]["content"] == "Hello from up"
    assert streamed["status"] == 200
    assert streamed["headers"]["content-type"].startswith("text/event-stream")
    assert streamed["headers"]["x-llms-provider"] == "up"
    events = [json.loads(line[6:]) for line in streamed["text"].splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == \
        "Hello from up"
    assert streamed["text"].rstrip().endswith("data: [DONE]")
