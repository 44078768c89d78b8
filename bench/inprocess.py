"""The gateway's own code per request, driven in-process: no server, no upstream, no load noise.

    .venv/bin/python bench/inprocess.py [--stream [--chunks 2]] [--requests 10000] [--profile]

Each request goes through `FastRelay` with a real uvicorn `RequestResponseCycle` over a
transport that only counts writes, so the fast path (`write_to_uvicorn`, `stream_to_uvicorn`)
is the one taken; the upstream call is replaced by the bench upstream's canned answer (a whole
completion, or a stream of `--chunks` events, the last with finish_reason, each after a turn
of the event loop as a chunk from a socket would be). Prints µs per request, best and all of five
rounds; `--profile` adds cProfile's top functions. On this shared machine wrk's req/s moves
±15% run to run; this moves a few %, which is what it is for: comparing a change before/after.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Coroutine, Mapping
from pathlib import Path
from typing import Any

import uvloop
from fake_upstream import CHUNK, COMPLETION, LAST  # run by path, bench/ is on sys.path
from harness import gateway_config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

import providers.http
from gateway import config
from gateway.app import create_app, lifespan
from gateway.fastpath import FastRelay

HEADERS = {"Content-Type": "application/json"}


async def canned_whole(self: Any, method: str, url: str, body: bytes | None
                       ) -> tuple[bytes, Mapping[str, str]]:
    return COMPLETION, HEADERS


def canned_stream(chunks: int) -> Any:
    async def stream(self: Any, url: str, body: bytes) -> AsyncGenerator[bytes, None]:
        for _ in range(chunks - 1):
            yield CHUNK
            await asyncio.sleep(0)  # the next chunk comes in a later turn of the loop
        yield LAST
    return stream


class CountingTransport:
    """What uvicorn's cycle writes to: counts writes, never pauses, never closes."""

    writes = 0

    def write(self, data: bytes) -> None:
        CountingTransport.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def one_request(app: FastRelay, body: bytes) -> Coroutine[Any, Any, None]:
    """One POST /v1/chat/completions, its body already received, as uvicorn would run it."""
    scope: Any = {
        "type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"",
        "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
        "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "asgi": {"version": "3.0"},
        "headers": [(b"host", b"gateway"), (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(body))]}
    transport: Any = CountingTransport()
    arrived = asyncio.Event()
    arrived.set()  # uvicorn sets it when the body is in
    log = logging.getLogger("bench.inprocess")
    cycle = RequestResponseCycle(scope, transport, FlowControl(transport), log, log, False, [],
                                 arrived, False, True, lambda: None)
    cycle.body, cycle.more_body = bytearray(body), False
    receive: Any = cycle.receive  # uvicorn's and Litestar's ASGI types differ only in name
    send: Any = cycle.send
    return app(scope, receive, send)


async def measure(app: FastRelay, body: bytes, requests: int, profile: bool) -> None:
    async with lifespan(app.app):
        for _ in range(500):  # warm-up
            await one_request(app, body)
        if CountingTransport.writes < 500:
            sys.exit("the fast path wrote nothing: is uvicorn's cycle still what fastpath expects?")
        rounds = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(requests):
                await one_request(app, body)
            rounds.append((time.perf_counter() - started) / requests * 1e6)
        print(f"µs per request: best {min(rounds):.1f}, rounds "
              + ", ".join(f"{r:.1f}" for r in rounds))
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(requests):
                await one_request(app, body)
            profiler.disable()
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--chunks", type=int, default=2, help="events per stream (--stream)")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    providers.http.HttpUpstream._whole = canned_whole  # type: ignore[method-assign]
    providers.http.HttpUpstream.stream = canned_stream(max(1, args.chunks))  # type: ignore[method-assign]
    path = Path(tempfile.mkdtemp(prefix="llms-inprocess-")) / "llms.json"
    gateway_config(9, path)  # the upstream is never called: port 9 (discard)
    app = create_app(config.load(path))
    body = json.dumps({"model": "bench-model", "stream": args.stream, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    uvloop.run(measure(app, body, args.requests, args.profile))


if __name__ == "__main__":
    main()
