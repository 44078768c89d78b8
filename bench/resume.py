"""The resume part: what the seam of a resumed stream costs, and what resume costs the rest.

Two upstreams on core 1: `resume.py upstream --cut 100` streams 200 one-token chunks and drops
the connection after 100 of them (a stream cut halfway); `fake_upstream.py --chunks 100` answers
every stream whole (the continuation). One gateway on core 0 serves alias `resumed` (`"resume":
true`: the cutting upstream, then the whole one) and `bench-model` and `bench-resume` (both on
the whole upstream, `bench-resume` with resume on, never needed).

- seam: `SEAM_STREAMS` streams of `resumed`, one at a time; per stream, the gap between the
  client's last chunk before the cut and its first after it (the continuation's connect and
  first token: the seam), against the stream's median gap between chunks.
- req/s: closed-loop streams of `bench-model` then `bench-resume` (10 clients, alternating
  rounds), each read to `[DONE]`: resume's cost to streams that never break (every event of
  theirs is read by the seam's watch), as a ratio in the same run.

Reported, not judged. Run alone: `.venv/bin/python bench/run.py --only resume`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from harness import (
    BENCH,
    PY,
    free_port,
    gateway_command,
    percentile,
    provider,
    spawn,
    wait_for_port,
)
from scenarios import CHAT, Started, on_core1

CHUNKS = 200
CUT = 100
SEAM_STREAMS = 50
CONCURRENCY = 10
# The cutting upstream's pause before it drops the connection (so what it wrote arrives first):
# part of the gap at the cut, not of the seam.
CUT_PAUSE = 0.01
CHUNK = (b'data: {"id":"chatcmpl-cut","object":"chat.completion.chunk","created":1700000000,'
         b'"model":"bench-upstream-model","choices":[{"index":0,"delta":{"content":"tok "},'
         b'"finish_reason":null}]}\n\n')


async def _cutting(request: web.Request) -> web.StreamResponse:
    """A stream cut after `cut` of its chunks: the connection dropped mid-body."""
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(request.app["cut"]):
        await response.write(CHUNK)
    await asyncio.sleep(CUT_PAUSE)  # what came reaches the gateway before the reset
    if request.transport is not None:
        request.transport.abort()
    return response


def serve_upstream(port: int, cut: int) -> None:
    app = web.Application()
    app["cut"] = cut
    app.router.add_post("/v1/chat/completions", _cutting)
    web.run_app(app, host="127.0.0.1", port=port, print=None, loop=uvloop.new_event_loop())


async def _stream(session: aiohttp.ClientSession, url: str, model: str) -> list[float]:
    """One stream read to its end: when each chunk arrived."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    stamps: list[float] = []
    async with session.post(url, json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                stamps.append(time.perf_counter())
            if line.startswith(b"data: [DONE]"):
                return stamps
    raise RuntimeError("stream ended without [DONE]")


async def _seam(url: str, streams: int) -> dict[str, Any]:
    seams, gaps = [], []
    async with aiohttp.ClientSession() as session:
        for _ in range(streams):
            stamps = await _stream(session, url, "resumed")
            between = [b - a for a, b in itertools.pairwise(stamps)]
            # The cutting upstream sends CUT chunks: the CUT-th gap spans the cut.
            seams.append(between[CUT - 1])
            gaps.append(statistics.median(between[:CUT - 1] + between[CUT:]))
    seams = [seam - CUT_PAUSE for seam in seams]
    return {"seam_ms": statistics.median(seams) * 1000,
            "seam_p90_ms": percentile(seams, 0.9) * 1000,
            "gap_ms": statistics.median(gaps) * 1000}


async def _rate(url: str, model: str, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _stream(session, url, model)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return done / (time.perf_counter() - started)


def resume(work: Path, seconds: float, rounds: int) -> dict[str, Any]:
    """The seam's added latency, and streams' req/s with resume on against off."""
    with Started(work) as started:
        whole = started.upstream("--chunks", CHUNKS - CUT)
        cutting = free_port()
        process = spawn([PY, str(BENCH / "resume.py"), "upstream", "--port", str(cutting),
                         "--cut", str(CUT)], 1, work / "resume-upstream.log")
        started.processes.append(process)
        wait_for_port(cutting, process)
        models = {"bench-model": "bench-upstream-model", "bench-resume": "bench-upstream-model",
                  "resumed": "bench-upstream-model"}
        config, port = work / "resume.json", free_port()
        config.write_text(json.dumps({
            "server": {"host": "127.0.0.1"},
            "providers": {
                "cutter": {**provider(cutting), "models": {"resumed": "bench-upstream-model"}},
                "whole": {**provider(whole), "models": models}},
            "models": {"resumed": {"resume": True}, "bench-resume": {"resume": True}}}))
        gateway = spawn(gateway_command(config, port), 0, work / "resume-gateway.log")
        started.processes.append(gateway)
        wait_for_port(port, gateway)
        url = f"http://127.0.0.1:{port}{CHAT}"
        seam = on_core1("resume.py", "seam", "--url", url, "--streams", SEAM_STREAMS)
        rows = []
        for round_ in range(rounds):  # in turn first, so drift touches both alike
            rps = {}
            for model in ("bench-model", "bench-resume")[::1 if round_ % 2 else -1]:
                rps[model] = on_core1("resume.py", "rate", "--url", url, "--model", model,
                                      "--seconds", seconds)["rps"]
            off, on = rps["bench-model"], rps["bench-resume"]
            rows.append({"off_rps": off, "on_rps": on, "ratio": on / off})
    out = {**seam, "rounds": rows, "ratio_median": statistics.median(r["ratio"] for r in rows),
           "chunks": CHUNKS, "cut": CUT, "concurrency": CONCURRENCY}
    print(resume_table(out), flush=True)
    return out


def resume_table(part: dict[str, Any]) -> str:
    return "\n".join([
        f"streams of {part['chunks']} chunks; the resumed one cut after {part['cut']}", "",
        "| measure | value |", "|---|---|",
        "| seam (last chunk before the cut to the first after, less the upstream's pause "
        f"before its reset), median | {part['seam_ms']:.2f} ms |",
        f"| seam, p90 | {part['seam_p90_ms']:.2f} ms |",
        f"| gap between chunks elsewhere, median | {part['gap_ms']:.3f} ms |",
        f"| streams/s, resume on / off ({part['concurrency']} clients), median ratio "
        f"| {part['ratio_median']:.2f} |"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("upstream", "seam", "rate"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--cut", type=int, default=CUT)
    parser.add_argument("--url")
    parser.add_argument("--model")
    parser.add_argument("--streams", type=int, default=SEAM_STREAMS)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port, args.cut)
    elif args.role == "seam":
        print(json.dumps(uvloop.run(_seam(args.url, args.streams))))
    else:
        print(json.dumps({"rps": uvloop.run(_rate(args.url, args.model, args.seconds))}))


if __name__ == "__main__":
    main()
