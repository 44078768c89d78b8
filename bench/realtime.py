"""The realtime part: what relaying a Realtime session costs a frame, against the upstream direct
and against the gateway's framework and server without the gateway.

A fake Realtime upstream (this file run as `realtime.py upstream`, on core 1) answers every
client frame with one server frame of the same size at once (an echo, as an audio delta). The
gateway (core 0) relays `/v1/realtime?model=bench-realtime` to it; so does the minimal relay
(`realtime.py relay`, core 0): a Litestar WebSocket route pumping frames both ways through
aiohttp's client, served by granian with the gateway's settings, as the throughput part's
minimal proxy is (no key, record, limits or event read). The client (core 1) opens `SESSIONS`
sessions at once, direct, through the gateway and through the minimal relay, in alternating
rounds; each sends `FRAMES` frames of `SIZE` bytes one after another, waiting for each echo: the
round trip per frame (p50, p99), the frames relayed per second (both ways) over all sessions,
and the server's CPU time per frame relayed (its processes', read from /proc around the round).
Reported: the gateway's added latency per frame (its p50 minus direct's), its frames/s against
direct's and against the minimal relay's, and its CPU per frame against the minimal relay's.
Reported, not judged.

Run alone: `.venv/bin/python bench/run.py --only realtime`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from harness import (
    BENCH,
    PY,
    free_port,
    gateway_command,
    percentile,
    spawn,
    stop,
    tree,
    wait_for_port,
)
from litestar import Litestar, WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

SESSIONS, FRAMES, SIZE, ROUNDS = 20, 200, 4096, 3
RELAY_UPSTREAM_ENV = "REALTIME_RELAY_UPSTREAM"


async def _echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=0)
    await ws.prepare(request)
    async for message in ws:
        await ws.send_str(message.data)
    return ws


def upstream(port: int) -> None:
    """The fake upstream: every frame echoed."""
    app = web.Application()
    app.router.add_get("/v1/realtime", _echo)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def create_relay() -> Litestar:
    """The minimal relay: the upstream's URL from the environment (a factory takes none)."""
    upstream = os.environ[RELAY_UPSTREAM_ENV]
    sessions: list[aiohttp.ClientSession] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            sessions.append(session)
            yield

    @websocket("/v1/realtime")
    async def relayed(socket: WebSocket[Any, Any, Any]) -> None:
        async with sessions[0].ws_connect(upstream, max_msg_size=0) as ws:
            await socket.accept()

            async def up() -> None:
                with contextlib.suppress(WebSocketDisconnect):
                    while True:
                        message = await socket.receive()
                        if message["type"] != "websocket.receive":
                            return
                        await ws.send_str(message.get("text") or "")

            async def down() -> None:
                async for message in ws:
                    await socket.send({"type": "websocket.send", "text": message.data,
                                       "bytes": None})

            pumps = [asyncio.create_task(up()), asyncio.create_task(down())]
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()
        with contextlib.suppress(Exception):
            await socket.close()

    return Litestar([relayed], lifespan=[lifespan], debug=False, openapi_config=None,
                    logging_config=None)


def relay(port: int, upstream: str) -> None:
    """The minimal relay on granian, with the gateway's settings."""
    os.environ[RELAY_UPSTREAM_ENV] = upstream
    from gateway.core.settings import ServerConfig
    from gateway.edge.serving import run

    run(ServerConfig(), "127.0.0.1", port, 1, 65536, app="realtime:create_relay")


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time of `pid` and its descendants so far."""
    ticks = 0
    for member in tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def _session(session: aiohttp.ClientSession, url: str, times: list[float]) -> None:
    frame = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * SIZE})
    async with session.ws_connect(url, max_msg_size=0) as ws:
        for _ in range(FRAMES):
            started = time.perf_counter()
            await ws.send_str(frame)
            await ws.receive()
            times.append(time.perf_counter() - started)


async def _round(url: str) -> dict[str, float]:
    times: list[float] = []
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(_session(session, url, times) for _ in range(SESSIONS)))
        took = time.perf_counter() - started
    return {"p50_ms": statistics.median(times) * 1000,
            "p99_ms": percentile(times, 0.99) * 1000,
            "frames_per_s": 2 * len(times) / took}


def client(urls: dict[str, str], servers: dict[str, int], rounds: int, out: Path) -> None:
    """Alternating rounds over `urls` (direct first), each server's CPU time per frame relayed
    read around its rounds (`servers`: name to pid); JSON written to `out`."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            used = cpu_seconds(servers[name]) if name in servers else 0.0
            measured = asyncio.run(_round(url))
            if name in servers:
                frames = 2 * SESSIONS * FRAMES
                measured["cpu_us_per_frame"] = (cpu_seconds(servers[name]) - used) / frames * 1e6
            results[name].append(measured)
    out.write_text(json.dumps(results))


def realtime(work: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """The part as `run.py` runs it."""
    up_port, gw_port, relay_port = free_port(), free_port(), free_port()
    config = work / "realtime.json"
    config.write_text(json.dumps({"server": {"host": "127.0.0.1"}, "providers": {"fake": {
        "type": "openai", "base_url": f"http://127.0.0.1:{up_port}/v1", "api_key": "bench-key",
        "models": {"bench-realtime": {"id": "bench-upstream", "realtime": True}}}},
        "realtime": {"max_sessions_per_key": 100}}))
    direct = f"ws://127.0.0.1:{up_port}/v1/realtime?model=bench-upstream"
    fake = spawn([PY, str(BENCH / "realtime.py"), "upstream", str(up_port)], 1,
                 work / "realtime-upstream.log")
    gateway = spawn(gateway_command(config, gw_port), 0, work / "realtime-gateway.log")
    minimal = spawn([PY, str(BENCH / "realtime.py"), "relay", str(relay_port), direct], 0,
                    work / "realtime-relay.log")
    try:
        wait_for_port(up_port, fake)
        wait_for_port(gw_port, gateway)
        wait_for_port(relay_port, minimal)
        out = work / "realtime-client.json"
        urls = {"direct": direct,
                "gateway": f"ws://127.0.0.1:{gw_port}/v1/realtime?model=bench-realtime",
                "minimal": f"ws://127.0.0.1:{relay_port}/v1/realtime"}
        measured = spawn([PY, str(BENCH / "realtime.py"), "client", json.dumps(urls),
                          json.dumps({"gateway": gateway.pid, "minimal": minimal.pid}),
                          str(rounds), str(out)], 1, work / "realtime-client.log")
        measured.wait(timeout=600)
    finally:
        stop(minimal)
        stop(gateway)
        stop(fake)
    raw = json.loads(out.read_text())
    summary = {side: {name: statistics.median(r[name] for r in raw[side]) for name in raw[side][0]}
               for side in raw}
    summary["added_ms_per_frame"] = {"p50": summary["gateway"]["p50_ms"]
                                     - summary["direct"]["p50_ms"]}
    summary["frames_ratio"] = {
        "gateway_vs_direct": summary["gateway"]["frames_per_s"]
        / summary["direct"]["frames_per_s"],
        "minimal_vs_direct": summary["minimal"]["frames_per_s"]
        / summary["direct"]["frames_per_s"],
        "gateway_vs_minimal": summary["gateway"]["frames_per_s"]
        / summary["minimal"]["frames_per_s"]}
    return summary


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("upstream", "relay", "client"))
    parser.add_argument("args", nargs="*")
    parsed = parser.parse_args(argv)
    if parsed.role == "upstream":
        upstream(int(parsed.args[0]))
    elif parsed.role == "relay":
        relay(int(parsed.args[0]), parsed.args[1])
    else:
        client(json.loads(parsed.args[0]), json.loads(parsed.args[1]), int(parsed.args[2]),
               Path(parsed.args[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
