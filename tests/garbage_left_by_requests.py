"""Serve streams that end, fail or lose their client through the real server, then write the
cyclic garbage they left behind to a JSON file ({type: count}).

Run as a script by tests/test_stream_faults.py, in a process of its own, because it looks at
the whole process's collector: the gateway under uvicorn (as `gateway serve` runs it) on a
loopback port, and raw sockets as the clients; the test runs the upstreams, in its own process.
Garbage in cycles waits for the collector, and a collection's pause grows with what it finds: a
request that leaves a cycle behind costs every request a stall later.

Usage: python -m tests.garbage_left_by_requests CONFIG CLIENTS OUT
CONFIG serves "slow-stream" (a stream taking > 50 ms), "cut-stream" (its upstream dies
mid-stream) and "slow-start" (no first token for long).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import sys
from pathlib import Path

import uvicorn
import uvloop

from gateway import config
from gateway.app import create_app
from gateway.observe.metrics import INFLIGHT
from tests.gateway_process import free_port


def _request(model: str, stream: bool) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "stream": stream}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


async def _client(port: int, request: bytes, after_bytes: int, after_seconds: float) -> None:
    """Send `request`; close the connection after `after_bytes` of answer, or after
    `after_seconds` if that is 0, or at the end of the answer if both are."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    if after_bytes:
        await reader.readexactly(after_bytes)
    elif after_seconds:
        await asyncio.sleep(after_seconds)
    else:
        await reader.readuntil(b"\r\n0\r\n\r\n")  # the last chunk of a chunked body
    writer.close()
    await writer.wait_closed()


async def _settle(port: int) -> None:
    """Return once no request holds an upstream any more."""
    idle = f"\n{INFLIGHT[0]} 0.0\n".encode()
    for _ in range(500):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        metrics = await reader.read()
        writer.close()
        await writer.wait_closed()
        if idle in metrics:
            await asyncio.sleep(0.1)  # the after-answer work (log line, metrics)
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("requests still in flight after 5 s")


async def _rounds(port: int, clients: int) -> None:
    """`clients` at once read a slow stream to its end, then one its upstream cuts; leave one
    mid-stream, then before the first token of a stream and of a whole answer (the disconnect
    watcher arms after 50 ms)."""
    rounds = [(_request("slow-stream", True), 0, 0.0),
              (_request("cut-stream", True), 0, 0.0),
              (_request("slow-stream", True), 400, 0.0),
              (_request("slow-start", True), 0, 0.2),
              (_request("slow-start", False), 0, 0.2)]
    for request, after_bytes, after_seconds in rounds:
        await asyncio.gather(*(_client(port, request, after_bytes, after_seconds)
                               for _ in range(clients)))
        await _settle(port)


async def main(config_path: Path, clients: int) -> dict[str, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        create_app(config.load(config_path)), host="127.0.0.1", port=port, loop="none",
        http="httptools", access_log=False, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve())
    for _ in range(1000):
        if server.started:
            break
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError("the gateway did not start in 10 s")
    try:
        await _rounds(port, 3)  # once first: first-use caches are not what this looks for
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # keep what the collector finds, to name it
        await _rounds(port, clients)
        gc.collect()
        gc.set_debug(0)
        garbage = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}"
                                      for o in gc.garbage)
        gc.garbage.clear()
    finally:
        server.should_exit = True
        await serving
    return dict(garbage)


if __name__ == "__main__":
    found = uvloop.run(main(Path(sys.argv[1]), int(sys.argv[2])))
    Path(sys.argv[3]).write_text(json.dumps(found))
