"""Streaming load: many concurrent SSE chat completions, timing every chunk as it arrives.

`--mode chunks` (latency): N workers each open streams back to back for `--duration` seconds,
their first starts spread over `--stagger` seconds so stream starts are steady rather than all at
once. Against `fake_upstream.py --stamp`, each chunk's one-way latency is its arrival time minus
the upstream's write time (both time.monotonic(), shared by processes on one machine); also
recorded are time to first chunk from the request, gaps between chunks, and reads that carried
more than one chunk (coalescing).

`--mode hold` (capacity): open `--streams` streams, spread over `--ramp` seconds, read each to
its end, and count how many completed with `[DONE]`, how many failed, and the most open at once.
Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time

import aiohttp
import uvloop

from gateway.edge import openfiles

BODY = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 256, "stream": True}).encode()
STAMP = re.compile(rb"tok@([0-9]+\.[0-9]+)")


def pct(values: list[float], *points: float) -> dict[str, float]:
    if len(values) < 2:
        return {f"p{p:g}": (values[0] * 1000 if values else 0.0) for p in points}
    cuts = statistics.quantiles(values, n=1000)
    return {f"p{p:g}": cuts[min(998, int(p * 10) - 1)] * 1000 for p in points}


class Tally:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.oneway: list[float] = []
        self.gaps: list[float] = []
        self.reads = 0
        self.coalesced = 0
        self.chunks = 0
        self.completed = 0
        self.failed = 0
        self.open = 0
        self.max_open = 0


async def stream(session: aiohttp.ClientSession, url: str, tally: Tally, record: bool) -> None:
    sent = time.monotonic()
    done = False
    counted_open = False
    try:
        async with session.post(url, data=BODY,
                                headers={"Content-Type": "application/json"}) as response:
            if response.status != 200:
                await response.read()
                raise aiohttp.ClientError(f"status {response.status}")
            tally.open += 1
            counted_open = True
            tally.max_open = max(tally.max_open, tally.open)
            last = None
            async for data in response.content.iter_any():
                now = time.monotonic()
                stamps = STAMP.findall(data)
                if b"[DONE]" in data:
                    done = True
                if not stamps or not record:
                    continue
                tally.reads += 1
                tally.chunks += len(stamps)
                if len(stamps) > 1:
                    tally.coalesced += 1
                if last is None:
                    tally.ttft.append(now - sent)
                else:
                    tally.gaps.append(now - last)
                last = now
                tally.oneway.extend(now - float(s) for s in stamps)
    except (TimeoutError, aiohttp.ClientError):
        done = False
    finally:
        if counted_open:
            tally.open -= 1
    if done:
        tally.completed += 1
    else:
        tally.failed += 1


async def chunks_mode(url: str, streams: int, duration: float, stagger: float,
                      warmup: float) -> dict[str, object]:
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(stream(session, url, Tally(), False)
                               for _ in range(min(streams, 20))))
        start = time.monotonic()
        until = start + warmup + duration

        async def worker(i: int) -> None:
            await asyncio.sleep(stagger * i / streams)
            while time.monotonic() < until:
                await stream(session, url, tally, time.monotonic() >= start + warmup)

        await asyncio.gather(*(worker(i) for i in range(streams)))
    points = (50, 90, 99, 99.9)
    return {"streams": tally.completed + tally.failed, "completed": tally.completed,
            "failed": tally.failed, "chunks": tally.chunks, "reads": tally.reads,
            "coalesced_reads": tally.coalesced,
            "ttft_ms": pct(tally.ttft, *points), "chunk_latency_ms": pct(tally.oneway, *points),
            "gap_ms": pct(tally.gaps, *points),
            "gap_mean_ms": statistics.fmean(tally.gaps) * 1000 if tally.gaps else 0.0}


async def hold_mode(url: str, streams: int, ramp: float) -> dict[str, object]:
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def delayed(i: int) -> None:
            await asyncio.sleep(ramp * i / streams)
            await stream(session, url, tally, False)

        started = time.monotonic()
        await asyncio.gather(*(delayed(i) for i in range(streams)))
    return {"streams": streams, "completed": tally.completed, "failed": tally.failed,
            "max_open": tally.max_open, "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=("chunks", "hold"), default="chunks")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--stagger", type=float, default=2.0)
    parser.add_argument("--ramp", type=float, default=5.0)
    args = parser.parse_args()
    openfiles.raise_limit()
    if args.mode == "chunks":
        result = uvloop.run(chunks_mode(args.url, args.streams, args.duration, args.stagger,
                                        args.warmup))
    else:
        result = uvloop.run(hold_mode(args.url, args.streams, args.ramp))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
