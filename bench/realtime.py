"""The realtime part: what relaying a Realtime session costs a frame, against the upstream direct.

A fake Realtime upstream (this file run as `realtime.py upstream`, on core 1) answers every
client frame with one server frame of the same size at once (an echo, as an audio delta). The
gateway (core 0) relays `/v1/realtime?model=bench-realtime` to it. The client (core 1) opens
`SESSIONS` sessions at once, direct and through the gateway, alternating rounds; each sends
`FRAMES` frames of `SIZE` bytes one after another, waiting for each echo: the round trip per
frame (p50, p99) and the frames relayed per second (both ways) over all sessions. Reported:
the gateway's added latency per frame (its p50 minus direct's) and its frames/s against
direct's. Reported, not judged.

Run alone: `.venv/bin/python bench/run.py --only realtime`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from harness import BENCH, PY, free_port, gateway_command, percentile, spawn, stop, wait_for_port

SESSIONS, FRAMES, SIZE, ROUNDS = 20, 200, 4096, 3


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


def client(direct: str, gateway: str, rounds: int, out: Path) -> None:
    """Alternating rounds, direct then through the gateway; JSON written to `out`."""
    results: dict[str, list[dict[str, float]]] = {"direct": [], "gateway": []}
    for _ in range(rounds):
        results["direct"].append(asyncio.run(_round(direct)))
        results["gateway"].append(asyncio.run(_round(gateway)))
    out.write_text(json.dumps(results))


def realtime(work: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """The part as `run.py` runs it."""
    up_port, gw_port = free_port(), free_port()
    config = work / "realtime.json"
    config.write_text(json.dumps({"server": {"host": "127.0.0.1"}, "providers": {"fake": {
        "type": "openai", "base_url": f"http://127.0.0.1:{up_port}/v1", "api_key": "bench-key",
        "models": {"bench-realtime": {"id": "bench-upstream", "realtime": True}}}},
        "realtime": {"max_sessions_per_key": 100}}))
    fake = spawn([PY, str(BENCH / "realtime.py"), "upstream", str(up_port)], 1,
                 work / "realtime-upstream.log")
    gateway = spawn(gateway_command(config, gw_port), 0, work / "realtime-gateway.log")
    try:
        wait_for_port(up_port, fake)
        wait_for_port(gw_port, gateway)
        out = work / "realtime-client.json"
        measured = spawn([PY, str(BENCH / "realtime.py"), "client",
                          f"ws://127.0.0.1:{up_port}/v1/realtime?model=bench-upstream",
                          f"ws://127.0.0.1:{gw_port}/v1/realtime?model=bench-realtime",
                          str(rounds), str(out)], 1, work / "realtime-client.log")
        measured.wait(timeout=600)
    finally:
        stop(gateway)
        stop(fake)
    raw = json.loads(out.read_text())
    summary = {side: {name: statistics.median(r[name] for r in raw[side])
                      for name in ("p50_ms", "p99_ms", "frames_per_s")} for side in raw}
    summary["added_ms_per_frame"] = {"p50": summary["gateway"]["p50_ms"]
                                     - summary["direct"]["p50_ms"]}
    summary["frames_ratio"] = {"gateway_vs_direct": summary["gateway"]["frames_per_s"]
                               / summary["direct"]["frames_per_s"]}
    return summary


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("upstream", "client"))
    parser.add_argument("args", nargs="*")
    parsed = parser.parse_args(argv)
    if parsed.role == "upstream":
        upstream(int(parsed.args[0]))
    else:
        client(parsed.args[0], parsed.args[1], int(parsed.args[2]), Path(parsed.args[3]))


if __name__ == "__main__":
    main(sys.argv[1:])
