"""A client that is slow or greedy on purpose cannot starve the others: through real sockets
against `gateway serve`, a head that dribbles in, a body that never comes, a header of many
megabytes, and a connection left idle are each cut off, while real clients keep being answered.

Timing bounds are generous (the limit plus a few seconds): this machine is shared and noisy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import config
from gateway.core.errors import RequestTimeout
from gateway.edge.guard import Guard
from tests.gateway_process import GatewayProcess, provider
from tests.gateway_process import config as gateway_config
from tests.upstream import FakeUpstream
from tests.waiting import wait_until

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 2.0
SLACK = 4.0  # how much later than its limit a cut may come on a busy machine
MESSAGES = [{"role": "user", "content": "hello"}]
BODY = json.dumps({"model": "m", "messages": MESSAGES}).encode()


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="limits") as fake:
        yield fake


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory,
           upstream: FakeUpstream) -> Iterator[GatewayProcess]:
    """A gateway with short header and body timeouts."""
    gateway = GatewayProcess(tmp_path_factory.mktemp("strict"), gateway_config(
        {"up": provider(upstream.base_url, {"m": "m"})},
        server={"header_timeout": HEADER_TIMEOUT, "body_timeout": BODY_TIMEOUT}))
    gateway.start()
    yield gateway
    gateway.stop()


# --- helpers ---------------------------------------------------------------------------------

async def _until_closed(reader: asyncio.StreamReader, limit: float,
                        started: float | None = None) -> tuple[float | None, bytes]:
    """Read until the gateway closes the connection: (seconds it took since `started`, by default
    now, or None if it was still open after `limit`; what it sent)."""
    started = time.monotonic() if started is None else started
    received = b""
    try:
        async with asyncio.timeout(limit):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        return None, received
    except OSError:  # a reset is a close too
        pass
    return time.monotonic() - started, received


async def _dribbling(port: int, head: bytes, byte: bytes | None, limit: float
                     ) -> tuple[float | None, bytes]:
    """Send `head`, then `byte` every 0.25 s (or nothing more) until the gateway closes; the time
    counts from before the connection was made, so a client loop slow to resume after the connect
    (200 of them at once on a busy machine) never makes the server's timer look early."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)

    async def dribble() -> None:
        with contextlib.suppress(OSError):
            while byte:
                await asyncio.sleep(0.25)
                writer.write(byte)
                await writer.drain()

    task = asyncio.create_task(dribble())
    try:
        return await _until_closed(reader, limit, started)
    finally:
        task.cancel()
        writer.close()


def _status(received: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.1 (\d{3})", received)
    return int(match.group(1)) if match else None


def _error(received: bytes) -> dict[str, object]:
    error: dict[str, object] = json.loads(received.partition(b"\r\n\r\n")[2])["error"]
    return error


def _process_tree(pid: int) -> list[int]:
    """`pid` and every process below it: the gateway's server process and its workers."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def _rss_kib(gateway: GatewayProcess) -> int:
    """Resident memory of the gateway's processes, summed (VmRSS)."""
    assert gateway.process is not None
    total = 0
    for pid in _process_tree(gateway.process.pid):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            if match := re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE):
                total += int(match.group(1))
    return total


def _send_huge_header(port: int, request_line: bytes, size: int) -> tuple[int | None, bytes]:
    """A request whose one header is `size` bytes, written until the gateway answers or cuts
    the connection; its status and what it sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        received: list[bytes] = []

        def read() -> None:
            with contextlib.suppress(OSError):
                while chunk := sock.recv(65536):
                    received.append(chunk)

        reader = threading.Thread(target=read)
        reader.start()
        piece = b"a" * 65536
        with contextlib.suppress(OSError):
            sock.sendall(request_line + b"\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         + b"Content-Length: " + str(len(BODY)).encode() + b"\r\nX-Big: ")
            sent = 0
            while sent < size and not received:
                sock.sendall(piece[:size - sent])
                sent += len(piece)
            sock.sendall(b"\r\n\r\n" + BODY)
        reader.join(10)
    data = b"".join(received)
    return _status(data), data


# --- the stories -----------------------------------------------------------------------------

def test_clients_dribbling_their_headers_are_cut_off_while_real_clients_keep_being_answered(
        strict: GatewayProcess) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
    answered: list[int] = []

    async def real_client(stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=5) as client:
            while not stop.is_set():
                answered.append((await client.get(f"{strict.url}/health")).status_code)
                await asyncio.sleep(0.1)  # a real client's pace, not a wait

    async def scenario() -> list[tuple[float | None, bytes]]:
        stop = asyncio.Event()
        client = asyncio.create_task(real_client(stop))
        closes = await asyncio.gather(*(_dribbling(strict.port, head, b"a", HEADER_TIMEOUT + 10)
                                        for _ in range(200)))
        stop.set()
        await client
        return closes

    closes = asyncio.run(scenario())

    times = [at for at, _ in closes]
    assert None not in times, "every dribbling connection was closed"
    assert max(t for t in times if t is not None) <= HEADER_TIMEOUT + SLACK
    assert min(t for t in times if t is not None) >= HEADER_TIMEOUT / 2, "cut by the timer"
    assert answered and set(answered) == {200}, "real clients were answered all along"


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
        strict: GatewayProcess) -> None:
    closed, _ = asyncio.run(_dribbling(strict.port, b"", None, HEADER_TIMEOUT + 10))

    assert closed is not None and HEADER_TIMEOUT / 2 <= closed <= HEADER_TIMEOUT + SLACK


@pytest.mark.parametrize("dribbling", [False, True], ids=["stalled", "dribbling"])
def test_a_declared_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes(
        strict: GatewayProcess, upstream: FakeUpstream, dribbling: bool) -> None:
    upstream.reset()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + BODY[:10])

    closed, received = asyncio.run(_dribbling(strict.port, head, b" " if dribbling else None,
                                              BODY_TIMEOUT + 10))

    assert _status(received) == 408
    assert _error(received)["code"] == "request_timeout"
    assert b"connection: close" in received.lower()
    assert closed is not None and BODY_TIMEOUT / 2 <= closed <= BODY_TIMEOUT + SLACK
    assert upstream.requests == [], "nothing reached the provider"
    assert httpx.get(f"{strict.url}/ready").json()["inflight"] == 0, "the request counted out"


@pytest.mark.parametrize("request_line", [b"GET /health HTTP/1.1",
                                          b"POST /v1/chat/completions HTTP/1.1"],
                         ids=["health", "chat"])
def test_a_header_over_the_limit_is_refused_with_431_in_the_envelope(
        strict: GatewayProcess, upstream: FakeUpstream, request_line: bytes) -> None:
    upstream.reset()

    status, received = _send_huge_header(strict.port, request_line, 100 * 1024)

    assert status == 431
    assert _error(received)["code"] == "headers_too_large"
    assert upstream.requests == []


@pytest.mark.parametrize("request_line", [b"GET /health HTTP/1.1",
                                          b"POST /v1/chat/completions HTTP/1.1"],
                         ids=["health", "chat"])
def test_ten_multi_megabyte_headers_are_refused_quickly_and_memory_does_not_grow(
        strict: GatewayProcess, upstream: FakeUpstream, request_line: bytes) -> None:
    upstream.reset()
    before = _rss_kib(strict)
    started = time.monotonic()
    results: list[tuple[int | None, bytes]] = []
    threads = [threading.Thread(target=lambda: results.append(
        _send_huge_header(strict.port, request_line, 20 * 1024 * 1024))) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert len(results) == 10
    # The 431 usually arrives; the kernel may drop it when the gateway closes a socket with the
    # rest of a 20 MB header unread (a reset). Never an answer from the app, never a 200.
    assert {status for status, _ in results} <= {431, None}
    assert any(status == 431 for status, _ in results)
    assert time.monotonic() - started < 20, "cut off long before 200 MB were read"
    assert _rss_kib(strict) - before < 16 * 1024, "the gateway's memory did not grow"
    assert upstream.requests == []
    assert httpx.get(f"{strict.url}/health").status_code == 200


def test_a_large_but_allowed_header_is_served(strict: GatewayProcess) -> None:
    cookie = "c=" + "x" * 30_000

    response = httpx.get(f"{strict.url}/health", headers={"Cookie": cookie})

    assert response.status_code == 200


def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive_timeout(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(gateway_config(
        {"up": provider(upstream.base_url, {"m": "m"})},
        server={"keepalive_timeout": 1, "header_timeout": 10}))
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
               b"application/json\r\nContent-Length: " + str(len(BODY)).encode() + b"\r\n\r\n"
               + BODY)

    async def scenario() -> tuple[bytes, float | None, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"content-length: (\d+)", head.lower())
        assert length is not None
        await reader.readexactly(int(length.group(1)))
        closed, after = await _until_closed(reader, 10)
        writer.close()
        return head, closed, after

    head, closed, after = asyncio.run(scenario())

    assert _status(head) == 200
    assert closed is not None and 0.5 <= closed <= 1 + SLACK
    assert after == b"", "closed quietly, no answer to a request never sent"


def test_a_server_killed_outright_leaves_no_worker_serving(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    """The app runs in granian's worker process, a child of the one started: were that child
    to outlive a SIGKILL of its parent, it would go on answering on the port."""
    gateway = start_gateway(gateway_config({"up": provider(upstream.base_url, {"m": "m"})}))
    assert gateway.process is not None
    tree = _process_tree(gateway.process.pid)
    assert len(tree) >= 2, "the server process and its worker"

    os.kill(gateway.process.pid, signal.SIGKILL)
    gateway.process.wait()

    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in tree), within=30,
               what="every worker stopped")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{gateway.url}/health", timeout=2)


@pytest.mark.parametrize("field", ["header_timeout", "body_timeout", "keepalive_timeout"])
def test_a_timeout_that_is_not_positive_is_a_config_error_naming_the_field(
        tmp_path: Path, field: str) -> None:
    path = tmp_path / "llms.json"
    path.write_text(json.dumps({"server": {field: 0}, "providers": {}}))

    with pytest.raises(config.ConfigError, match=rf"server\.{field}"):
        config.load(path)



# --- the guard alone, in process: the cases a socket cannot time reliably ------------------------

def _guarded_run(app: Callable[..., Any], messages: list[dict[str, Any]], timeout: float = 0.2
                 ) -> list[dict[str, Any]]:
    """Run `app` behind the guard for one POST whose body arrives as `messages`, then never
    more; what the guard sent to the client."""
    sent: list[dict[str, Any]] = []
    pending = list(messages)

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # the rest of the body never comes
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"",
             "headers": [(b"content-length", b"100")]}
    guard = Guard(app, max_header_bytes=65536, body_timeout=timeout)
    asyncio.run(guard(scope, receive, send))  # type: ignore[arg-type]
    return sent


def test_a_body_arriving_in_time_reaches_the_app_untouched() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(await receive())
        seen.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})

    chunks = [{"type": "http.request", "body": b"a" * 50, "more_body": True},
              {"type": "http.request", "body": b"b" * 50, "more_body": False}]
    sent = _guarded_run(app, chunks)

    assert seen == chunks
    assert [m.get("status") for m in sent] == [200]


def test_an_overdue_body_gets_408_once_and_the_apps_own_answer_is_dropped() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        for _ in range(2):  # the app's read says what the client got, every time it asks
            try:
                while (await receive())["type"] == "http.request":
                    pass
            except RequestTimeout as exc:
                seen.append(exc.code)
        await send({"type": "http.response.start", "status": 408, "headers": []})

    sent = _guarded_run(app, [{"type": "http.request", "body": b"a", "more_body": True}])

    assert seen == ["request_timeout", "request_timeout"]
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [408]


def test_a_body_overdue_after_the_answer_started_only_tells_the_app_the_client_left() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        seen.append((await receive())["type"])

    sent = _guarded_run(app, [])

    assert seen == ["http.disconnect"]
    assert [m.get("status") for m in sent] == [200], "no 408 after an answer began"


def test_a_cancel_from_elsewhere_is_not_mistaken_for_the_deadline() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        waiting = asyncio.create_task(receive())
        await asyncio.sleep(0.01)  # a few turns: the guard's read under way when cancelled
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await send({"type": "http.response.start", "status": 204, "headers": []})

    sent = _guarded_run(app, [], timeout=30)

    assert [m.get("status") for m in sent] == [204]
