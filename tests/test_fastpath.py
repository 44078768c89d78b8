"""The relay's one-write answer, against a real uvicorn: `fastpath.write_to_uvicorn` reaches into
uvicorn's connection cycle, so these tests pin that coupling (an upgrade that breaks it fails
here instead of silently costing throughput)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import uvicorn
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

from gateway.fastpath import stream_to_uvicorn, write_to_uvicorn
from tests.gateway_process import free_port


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
            async def chunks() -> AsyncIterator[bytes]:
                for word in (b"one", b"two", b"three"):
                    yield b"data: %s\n\n" % word

            async def after() -> None:
                self.background_ran += 1

            stream = Stream(chunks(), media_type="text/event-stream",
                            background=BackgroundTask(after), headers={"x-request-id": "r1"})
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
