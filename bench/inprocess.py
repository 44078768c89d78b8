"""The gateway's own code per request, driven in-process: no server, no upstream, no load noise.

    .venv/bin/python bench/inprocess.py [--stream | --assembled] [--chunks 2] [--together]
                                        [--requests 10000]
                                        [--profile] [--key none|static|virtual]
                                        [--logs metadata|bodies]

The app `gateway serve` runs (`gateway.app.create_app()`) is called as a plain ASGI app with
`scope`, `receive` and `send` written here: its lifespan through the ASGI lifespan messages,
then POST /v1/chat/completions after POST, each body at hand at once, the answer's messages
counted. The upstream is a `Transport` (the contract's interface) answering from memory with the
bench upstream's canned completion, or a stream of `--chunks` events, the last with
finish_reason, each after a turn of the event loop as a chunk from a socket would be (with
`--together`, all in one read: how the bench's upstream's stream reaches a busy gateway). It takes
the place of the app's own through public attributes: `Runtime.transport`, then
`Runtime.apply`, which builds the providers anew on it. Prints µs per request, best and all of
five rounds; `--profile` adds cProfile's top functions (or, with `LLMS_PROFILE_OUT=FILE`,
writes them to FILE for pstats). On this shared machine wrk's req/s moves
±15% run to run; this moves a few %, which is what it is for: comparing a change before/after.
`--key static` sends a key of `server.api_keys`; `--key virtual` one made by `POST /admin/keys`
with a monthly budget, so each request is looked up, held against its budget and settled: the
accounts part's A/B, by CPU. `--logs` turns the request log on (`"logs": {"capture": …}`): its
rows are written by the app's own task meanwhile, their CPU counted (the request_log part's A/B,
by CPU). `--assembled` asks for whole answers from a provider with
`stream_upstream`: the upstream streams `--chunks` events, the gateway assembles them
(`gateway/adapters/assemble.py`), the `whole_streamed` part of `bench/run.py` by CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import uvloop
from fake_upstream import CHUNK, COMPLETION, LAST  # run by path, bench/ is on sys.path
from harness import STATIC_KEY, gateway_config
from multidict import CIMultiDict, CIMultiDictProxy

from gateway import config
from gateway.app import create_app
from providers.contract.transport import DIRECT, Link, Transport

App = Any  # an ASGI app: create_app()'s, whatever layers it puts in front of Litestar


class CannedAnswer:
    """An upstream answer from memory, read as `contract.transport.HttpResponse` reads."""

    def __init__(self, headers: Mapping[str, str], chunks: list[bytes],
                 ends_at_once: bool = False) -> None:
        self.status = 200
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self._chunks = chunks
        self._next = 0
        # The body's end came with its last chunk (a socket's one read): no turn to wait for it.
        self._ends_at_once = ends_at_once
        self._error: BaseException | None = None

    async def read(self, limit: int | None = None) -> bytes:
        body = b"".join(self._chunks[self._next:])
        self._next = len(self._chunks)
        return body if limit is None else body[:limit]

    async def readany(self) -> bytes:
        if self._next and not (self._ends_at_once and self._next == len(self._chunks)):
            await asyncio.sleep(0)  # the next chunk comes in a later turn of the loop
        if self._error is not None:
            raise self._error
        if self._next == len(self._chunks):
            return b""
        self._next += 1
        return self._chunks[self._next - 1]

    def set_exception(self, exc: BaseException) -> None:
        self._error = exc

    def close(self) -> None:
        pass


class CannedTransport(Transport):
    """Every upstream request answered at once from memory: a whole completion, or a stream."""

    def __init__(self, chunks: int | None, together: bool = False) -> None:
        self.chunks = chunks
        self.together = together
        self.requests = 0

    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      body: bytes | None = None, link: Link = DIRECT,
                      connect_timeout: float = 10.0, compressed: bool = True) -> CannedAnswer:
        self.requests += 1
        if self.chunks is None:
            return CannedAnswer({"Content-Type": "application/json"}, [COMPLETION])
        events = [CHUNK] * (self.chunks - 1) + [LAST]
        return CannedAnswer({"Content-Type": "text/event-stream"},
                            [b"".join(events)] if self.together else events, self.together)

    async def close(self) -> None:
        pass


@contextlib.asynccontextmanager
async def lifespan(app: App) -> AsyncIterator[None]:
    """The app's startup and shutdown, through the ASGI lifespan messages."""
    to_app: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    from_app: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    await to_app.put({"type": "lifespan.startup"})
    running = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                      to_app.get, from_app.put))
    started = await from_app.get()
    if started["type"] != "lifespan.startup.complete":
        sys.exit(f"the app did not start: {started}")
    try:
        yield
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        await from_app.get()
        await running


def litestar_of(app: App) -> Any:
    """The Litestar app behind `Front` and whatever layers wrap it."""
    from litestar import Litestar

    while not isinstance(app, Litestar):
        app = app.app
    return app


def services_of(app: App) -> Any:
    """The live `Runtime` of a started app: on the state of the Litestar app behind `Front`."""
    return litestar_of(app).state.runtime


class Client:
    """One POST /v1/chat/completions at a time, as an ASGI server would call the app."""

    def __init__(self, app: App, body: bytes, path: str = "/v1/chat/completions",
                 key: str | None = None) -> None:
        self.app = app
        self.body = {"type": "http.request", "body": body, "more_body": False}
        headers = [(b"host", b"localhost"), (b"content-type", b"application/json"),
                   (b"content-length", b"%d" % len(body))]
        if key is not None:
            headers.append((b"authorization", b"Bearer " + key.encode()))
        self.scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000), "headers": headers}
        self.statuses: dict[int, int] = {}
        self.messages = 0
        self.last_body = b""

    async def request(self) -> None:
        received = False

        async def receive() -> dict[str, Any]:
            nonlocal received
            if not received:
                received = True
                return self.body
            await asyncio.Future()  # the client stays until the answer ends
            raise AssertionError  # not reached: the wait above is only ever cancelled

        async def send(message: dict[str, Any]) -> None:
            self.messages += 1
            if message["type"] == "http.response.start":
                self.statuses[message["status"]] = self.statuses.get(message["status"], 0) + 1
            elif message.get("body"):
                self.last_body = message["body"]

        await self.app(dict(self.scope), receive, send)


async def virtual_key(app: App) -> str:
    """A key made through the admin API, with a budget far above what the run spends."""
    maker = Client(app, json.dumps({"name": "bench", "budget": {"usd": 1e6, "period": "month"}})
                   .encode(), path="/admin/keys")
    await maker.request()
    if maker.statuses != {201: 1}:
        sys.exit(f"no virtual key: {maker.statuses} {maker.last_body[:300]!r}")
    return str(json.loads(maker.last_body)["key"])


async def measure(app: App, body: bytes, transport: CannedTransport, requests: int,
                  profile: bool, key: str) -> None:
    """`key`: none, static (`STATIC_KEY`) or virtual (made once the app has started)."""
    async with lifespan(app):
        secret = STATIC_KEY if key == "static" else None
        if key == "virtual":
            secret = await virtual_key(app)
        client = Client(app, body, key=secret)
        runtime = services_of(app)
        # With tracing on (OTEL_EXPORTER_OTLP_ENDPOINT), wrapped as the app wraps its own.
        runtime.transport = transport if runtime.tracing is None else \
            runtime.tracing.transport(transport)
        await runtime.apply(runtime.configured)  # providers built anew on the canned one
        for _ in range(500):  # warm-up
            await client.request()
        if client.statuses != {200: 500} or transport.requests != 500:
            sys.exit(f"the warm-up was not 500 answers through the canned upstream: statuses "
                     f"{client.statuses}, upstream requests {transport.requests}; last body "
                     f"{client.last_body[:300]!r}")
        rounds = []
        for _ in range(5):
            # The process's CPU time (its threads', an exporter's included), not the wall's:
            # another process taking the core does not count.
            started = time.process_time()
            for _ in range(requests):
                await client.request()
            rounds.append((time.process_time() - started) / requests * 1e6)
        print(f"µs per request: best {min(rounds):.1f}, rounds "
              + ", ".join(f"{r:.1f}" for r in rounds)
              + f" ({client.messages / client.statuses[200]:.1f} ASGI messages sent each)")
        if profile:
            # Timed by this thread's CPU time: another process taking the core does not count.
            profiler = cProfile.Profile(time.thread_time)
            profiler.enable()
            for _ in range(requests):
                await client.request()
            profiler.disable()
            if out := os.environ.get("LLMS_PROFILE_OUT"):  # pstats' file, to read as you like
                profiler.dump_stats(out)
            else:
                pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--assembled", action="store_true",
                        help="whole answers asked upstream as streams and assembled")
    parser.add_argument("--chunks", type=int, default=2,
                        help="events per stream (--stream, --assembled)")
    parser.add_argument("--together", action="store_true",
                        help="the stream's events in one read, as the bench's upstream's "
                             "reach a gateway serving 10 clients")
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--key", choices=("none", "static", "virtual"), default="none")
    parser.add_argument("--logs", choices=("metadata", "bodies"), default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="llms-inprocess-"))
    path = folder / "llms.json"
    gateway_config(9, path)  # the upstream is never called: port 9 (discard)
    settings = json.loads(path.read_text())
    settings["database"] = {"url": f"sqlite:///{folder}/accounts.db"}
    if args.key == "static":
        settings["server"]["api_keys"] = [STATIC_KEY]
    if args.logs is not None:
        settings["logs"] = {"capture": args.logs}
    if args.assembled:
        settings["providers"]["fake"]["stream_upstream"] = True
    if args.key == "virtual":  # a budgeted key is refused a model without a price
        settings["providers"]["fake"]["models"] = {
            "bench-model": {"id": "bench-upstream-model", "price": {"input": 1.0, "output": 2.0}}}
    path.write_text(json.dumps(settings))
    app = create_app(config.load(path))
    body = json.dumps({"model": "bench-model", "stream": args.stream, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    streams = args.stream or args.assembled
    transport = CannedTransport(max(1, args.chunks) if streams else None, args.together)
    uvloop.run(measure(app, body, transport, args.requests, args.profile, args.key))


if __name__ == "__main__":
    main()
