"""Which ASGI server a slow or greedy client cannot starve: each candidate serves the same trivial
ASGI app on loopback and gets the same abuse and the same load, in one run.

    .venv/bin/python bench/servers.py [--only granian --only hypercorn ...] [--rounds 3]
                                      [--json bench/results/servers-<time>.json]

Every candidate runs with the limits below (small, so that a run is short), through its public
API only. The checks, each against a fresh server:

- fresh idle: a connection that sends nothing; seconds until the server closes it;
- slow header: the server gets 256 open files, 300 connections send their head one byte every
  0.5 s; the share of them the server cut between 0.5 s and HEADER_TIMEOUT + 3 s, the share
  still open after HEADER_TIMEOUT + 8 s, and the share of a real client's GET /health answered
  (new connection every 0.2 s) once HEADER_TIMEOUT + 1 s have passed;
- slow body: a POST declaring 1,000 bytes sends 10, then nothing (stalled) or a byte every 0.5 s
  (dribbling); the status the server answered with, if any, and when it closed;
- header bomb: ten GET /health and then ten POST at once, each with a 50 MB header; their
  statuses, and how much the server's peak RSS (all its processes, VmHWM) grew;
- big head: one 100 KiB header (over the 64 KiB limit, far below a bomb): status, and whether
  the body is the gateway's JSON envelope;
- keep-alive idle: after one answer, seconds until the server closes the connection;
- shutdown: SIGTERM during a 1 s stream: the stream finishes, a new connection is refused, and
  the exit status; lifespan ran; with `workers=2`, answers come from two processes; whether
  answers carry a `server` header;
- throughput: wrk, 50 keep-alive connections, GET /health and a small POST, 5 s each, the
  server on core 0 and wrk on core 1, rounds alternating the candidates (medians); latency:
  bench/openloop.py at a steady 500 req/s, p50 and p99.

The app (`app`, and `guarded`: the same app behind `gateway.edge.guard.Guard`) is served by
`python bench/servers.py serve NAME PORT WORKERS`, which the checks start as a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0
KEEPALIVE = 4.0
MAX_HEADER = 64 * 1024
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BOMB = 50 * 1024 * 1024
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# --- the trivial app ---------------------------------------------------------------------------

_started = {"lifespan": False}


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """GET /health (JSON), GET /pid, GET /stream (10 chunks, 0.1 s apart), any POST: the body
    read whole and its size answered."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            _started["lifespan"] = True
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return
    if scope["method"] == "POST":
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await _json(send, {"received": size})
    elif scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        for i in range(10):
            await send({"type": "http.response.body", "body": b"chunk %d\n" % i,
                        "more_body": True})
            await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"end\n"})
    elif scope["path"] == "/pid":
        await _json(send, {"pid": os.getpid()})
    else:
        await _json(send, {"status": "ok", "lifespan": _started["lifespan"]})


async def _json(send: Send, doc: dict[str, Any]) -> None:
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _guarded() -> Any:
    from gateway.edge.guard import Guard

    return Guard(app, max_header_bytes=MAX_HEADER, body_timeout=BODY_TIMEOUT)


with contextlib.suppress(ImportError):  # the guard needs the project installed
    guarded = _guarded()


# --- the candidates, each through its public API -----------------------------------------------

def serve_uvicorn(target: str, port: int, workers: int, http: str) -> None:
    import uvicorn

    extra = {"h11_max_incomplete_event_size": MAX_HEADER} if http == "h11" else {}
    uvicorn.run(target, host="127.0.0.1", port=port, workers=workers, loop="uvloop", http=http,
                access_log=False, server_header=False, log_level="warning",
                timeout_graceful_shutdown=30, timeout_keep_alive=int(KEEPALIVE), **extra)


def serve_hypercorn(target: str, port: int, workers: int) -> None:
    from hypercorn.config import Config
    from hypercorn.run import run

    config = Config()
    config.application_path = target
    config.bind = [f"127.0.0.1:{port}"]
    config.workers = workers
    config.worker_class = "uvloop"
    config.keep_alive_timeout = KEEPALIVE
    config.read_timeout = int(HEADER_TIMEOUT)
    config.h11_max_incomplete_size = MAX_HEADER
    config.graceful_timeout = 30
    config.include_server_header = False
    config.accesslog = None
    config.loglevel = "WARNING"
    sys.exit(run(config))


def serve_granian(target: str, port: int, workers: int, **tuning: Any) -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    Granian(target, address="127.0.0.1", port=port, interface=Interfaces.ASGI, workers=workers,
            **tuning,
            loop=Loops.uvloop, http=HTTPModes.http1, websockets=False,
            http1_settings=HTTP1Settings(header_read_timeout=int(HEADER_TIMEOUT * 1000),
                                         max_buffer_size=2 * MAX_HEADER),
            log_level=LogLevels.warning, log_access=False, workers_kill_timeout=30).serve()


CANDIDATES: dict[str, Callable[[int, int], None]] = {
    "uvicorn-httptools": lambda p, w: serve_uvicorn("servers:app", p, w, "httptools"),
    "uvicorn-h11": lambda p, w: serve_uvicorn("servers:app", p, w, "h11"),
    "uvicorn-httptools+guard": lambda p, w: serve_uvicorn("servers:guarded", p, w, "httptools"),
    "hypercorn": lambda p, w: serve_hypercorn("servers:app", p, w),
    "granian": lambda p, w: serve_granian("servers:app", p, w),
    "granian+guard": lambda p, w: serve_granian("servers:guarded", p, w),
    # Tuning tried (docs/benchmarks.md): tokio's single-threaded runtime, and granian's Rust
    # task implementation (experimental, refused on Python >= 3.12).
    "granian-st": lambda p, w: serve_granian("servers:app", p, w, runtime_mode="st"),
    "granian-rusttask": lambda p, w: serve_granian("servers:app", p, w, task_impl="rust"),
}
MEASURED = [name for name in CANDIDATES if name not in ("granian-st", "granian-rusttask")]


# --- running a candidate -----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One candidate as a subprocess (its own process group), pinned to core 0."""

    def __init__(self, name: str, workers: int = 1, open_files: int | None = None) -> None:
        self.name = name
        self.port = free_port()
        command = [sys.executable, str(HERE / "servers.py"), "serve", name, str(self.port),
                   str(workers)]
        if open_files is not None:
            command = ["prlimit", f"--nofile={open_files}:{open_files}", "--", *command]
        env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{ROOT}"}
        self.process = subprocess.Popen(["taskset", "-c", "0", *command], env=env,
                                        start_new_session=True, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{name} did not start")

    def tree(self) -> list[int]:
        """The server's processes: the one started and every descendant."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return found

    def memory(self, field: str) -> int:
        """`field` (VmRSS, VmHWM) summed over the server's processes, in KiB."""
        total = 0
        for pid in self.tree():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{pid}/status").read_text()
                if match := re.search(rf"^{field}:\s+(\d+)", status, re.MULTILINE):
                    total += int(match.group(1))
        return total

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


# --- the checks --------------------------------------------------------------------------------

async def wait_closed(reader: asyncio.StreamReader, limit: float) -> tuple[float | None, bytes]:
    """Read until the server closes: (seconds it took or None if still open at `limit`, what it
    sent)."""
    started = time.monotonic()
    received = b""
    try:
        async with asyncio.timeout(limit):
            while chunk := await reader.read(65536):
                received += chunk
    except TimeoutError:
        return None, received
    except OSError:
        pass
    return time.monotonic() - started, received


def status_of(received: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    return int(match.group(1)) if match else None


def is_envelope(received: bytes) -> bool:
    body = received.partition(b"\r\n\r\n")[2]
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return set(json.loads(body)["error"]) >= {"message", "type", "code"}
    return False


async def fresh_idle(port: int) -> float | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    closed, _ = await wait_closed(reader, KEEPALIVE + 8)
    writer.close()
    return closed


async def keepalive_idle(port: int) -> float | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b"}")
    closed, _ = await wait_closed(reader, KEEPALIVE + 8)
    writer.close()
    return closed


async def dribble(writer: asyncio.StreamWriter, byte: bytes, every: float) -> None:
    with contextlib.suppress(OSError):
        while True:
            await asyncio.sleep(every)
            writer.write(byte)
            await writer.drain()


async def slow_connection(port: int, head: bytes, byte: bytes | None,
                          limit: float) -> tuple[float | None, bytes]:
    """A connection that sends `head`, then `byte` every 0.5 s (or nothing): when it was closed,
    and what the server sent."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
    except OSError:
        return 0.0, b""
    task = asyncio.create_task(dribble(writer, byte, 0.5)) if byte else None
    closed = await wait_closed(reader, limit)
    if task:
        task.cancel()
    writer.close()
    return closed


async def real_client(port: int, until: float, results: list[tuple[float, bool]]) -> None:
    """GET /health on a new connection every 0.2 s; (when, answered within 1 s)."""
    started = time.monotonic()
    while time.monotonic() < until:
        at = time.monotonic() - started
        ok = False
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(1):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                ok = status_of(await reader.read(4096)) == 200
                writer.close()
        results.append((at, ok))
        await asyncio.sleep(0.2)


async def slow_header(port: int) -> dict[str, Any]:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "
    limit = HEADER_TIMEOUT + 8
    answered: list[tuple[float, bool]] = []
    client = asyncio.create_task(real_client(port, time.monotonic() + limit, answered))
    closes = await asyncio.gather(*(slow_connection(port, head, b"a", limit)
                                     for _ in range(300)))
    await client
    # Closed at once: refused for want of a descriptor (libuv accepts and closes), not timed.
    timed = sum(1 for at, _ in closes if at is not None and 0.5 <= at <= HEADER_TIMEOUT + 3)
    late = [ok for at, ok in answered if at >= HEADER_TIMEOUT + 1]
    return {"cut_by_timer": timed / len(closes),
            "held_open": sum(1 for at, _ in closes if at is None) / len(closes),
            "real_client_answered": sum(late) / max(1, len(late))}


async def slow_body(port: int, dribbling: bool) -> dict[str, Any]:
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10
    at, received = await slow_connection(port, head, b"x" if dribbling else None,
                                         BODY_TIMEOUT + 8)
    return {"status": status_of(received), "closed_after": at,
            "envelope": is_envelope(received)}


async def oversized(port: int, method: bytes, size: int) -> tuple[int | None, bool, float]:
    """A request with a `size`-byte header, sent until the server answers or closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    reading = asyncio.create_task(wait_closed(reader, 60))
    piece = b"a" * 65536
    with contextlib.suppress(OSError):
        writer.write(method + b" /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Big: ")
        for _ in range(size // len(piece)):
            if reading.done():
                break
            writer.write(piece)
            await writer.drain()
        writer.write(b"\r\n\r\n{}")
        await writer.drain()
    _, received = await reading
    writer.close()
    return status_of(received), is_envelope(received), time.monotonic() - started


async def header_bomb(server: Server) -> dict[str, Any]:
    before = server.memory("VmHWM")
    statuses = []
    for method in (b"GET", b"POST"):
        done = await asyncio.gather(*(oversized(server.port, method, BOMB) for _ in range(10)))
        statuses += [status for status, _, _ in done]
    return {"statuses": sorted(set(statuses), key=str),
            "peak_rss_growth_mib": (server.memory("VmHWM") - before) / 1024}


async def big_head(port: int) -> dict[str, Any]:
    status, envelope, _ = await oversized(port, b"GET", 100 * 1024)
    return {"status": status, "envelope": envelope}


async def shutdown(server: Server) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
    await reader.readuntil(b"chunk 0\n")
    os.kill(server.process.pid, signal.SIGTERM)
    stopped = time.monotonic()
    await asyncio.sleep(0.3)
    refused = True
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(1):
            r2, w2 = await asyncio.open_connection("127.0.0.1", server.port)
            w2.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            refused = status_of(await r2.read(4096)) is None
    _, rest = await wait_closed(reader, 5)
    writer.close()
    code = await asyncio.to_thread(server.process.wait, 35)
    return {"stream_finished": b"end\n" in rest, "new_refused": refused, "exit": code,
            "exit_after_s": round(time.monotonic() - stopped, 1)}


def lifespan_and_workers(name: str) -> dict[str, Any]:
    server = Server(name, workers=2)
    pids, lifespan, server_header = set(), True, False
    try:
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
                sock.sendall(b"GET /pid HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                head, _, body = _recv_all(sock).partition(b"\r\n\r\n")
                pids.add(json.loads(body)["pid"])
                server_header = server_header or b"\r\nserver:" in head.lower()
            with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                body = _recv_all(sock).partition(b"\r\n\r\n")[2]
                lifespan = lifespan and json.loads(body)["lifespan"]
    finally:
        server.stop()
    return {"worker_processes_answering": len(pids), "lifespan": lifespan,
            "server_header": server_header}


def _recv_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def abuse(name: str) -> dict[str, Any]:
    """Every check but the load ones, each against a fresh server."""
    result: dict[str, Any] = {}
    checks: dict[str, Callable[[Server], Awaitable[Any]]] = {
        "fresh_idle_closed_after": lambda s: fresh_idle(s.port),
        "keepalive_idle_closed_after": lambda s: keepalive_idle(s.port),
        "slow_body_stalled": lambda s: slow_body(s.port, dribbling=False),
        "slow_body_dribbling": lambda s: slow_body(s.port, dribbling=True),
        "big_head": lambda s: big_head(s.port),
        "header_bomb": header_bomb,
        "shutdown": shutdown,
    }
    for key, check in checks.items():
        server = Server(name)
        try:
            result[key] = asyncio.run(check(server))
        finally:
            server.stop()
    server = Server(name, open_files=256)
    try:
        result["slow_header"] = asyncio.run(slow_header(server.port))
    finally:
        server.stop()
    result.update(lifespan_and_workers(name))
    return result


# --- load ----------------------------------------------------------------------------------------

WRK_POST = """wrk.method = "POST"
wrk.body = '{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk(port: int, path: str, script: Path | None) -> float:
    command = ["taskset", "-c", "1", "wrk", "-t1", "-c50", "-d5s", f"http://127.0.0.1:{port}{path}"]
    if script:
        command[4:4] = ["-s", str(script)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return float(match.group(1)) if match else 0.0


def openloop(port: int) -> dict[str, float]:
    out = subprocess.run(
        ["taskset", "-c", "1", sys.executable, str(HERE / "openloop.py"), "--url",
         f"http://127.0.0.1:{port}/v1/chat/completions", "--rate", "500", "--duration", "5",
         "--warmup", "1"], capture_output=True, text=True, check=True).stdout
    doc: dict[str, float] = json.loads(out)
    return doc


def load(names: list[str], rounds: int, script: Path) -> dict[str, dict[str, float]]:
    """Each candidate in turn, `rounds` times over; the medians."""
    seen: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for _ in range(rounds):
        for name in names:
            server = Server(name)
            try:
                wrk(server.port, "/health", None)  # warm-up
                point = {"get_rps": wrk(server.port, "/health", None),
                         "post_rps": wrk(server.port, "/echo", script)}
                latency = openloop(server.port)
                point.update(p50_ms=latency["p50_ms"], p99_ms=latency["p99_ms"])
            finally:
                server.stop()
            for key, value in point.items():
                seen[name].setdefault(key, []).append(value)
    return {name: {key: statistics.median(values) for key, values in points.items()}
            for name, points in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=list(CANDIDATES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--skip-abuse", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = args.only or MEASURED
    results: dict[str, Any] = {name: {} for name in names}
    if not args.skip_abuse:
        for name in names:
            results[name].update(abuse(name))
            print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    if not args.skip_load:
        script = Path(tempfile.mkdtemp(prefix="servers-")) / "wrk_post.lua"
        script.write_text(WRK_POST)
        for name, point in load(names, args.rounds, script).items():
            results[name].update(point)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    CANDIDATES[sys.argv[2]](int(sys.argv[3]), int(sys.argv[4]))
elif __name__ == "__main__":
    main()
