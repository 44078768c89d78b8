"""An open-loop load generator: requests start at fixed intervals, whatever came back.

Request i is scheduled at start + i/rate and its latency is measured from that scheduled time,
not from when it was sent, so a stall in the target shows in every request it delayed (no
coordinated omission); a request the timer started early is measured from when it was sent.
Prints percentiles of latency, in ms, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp
import uvloop
from loadgen import post_chat  # run by path, bench/ is on sys.path


async def one(session: aiohttp.ClientSession, url: str, scheduled: float,
              latencies: list[float], errors: list[int]) -> None:
    delay = scheduled - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    sent = time.perf_counter()
    await post_chat(session, url, errors)
    # Late: from the scheduled time (the wait counts). Early (uvloop's timers have 1 ms
    # resolution and may fire before `scheduled`): from when it was sent, or a fast answer
    # would come out shorter than it took, even below zero.
    latencies.append(time.perf_counter() - min(scheduled, sent))


async def run(url: str, rate: float, duration: float, warmup: float) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        # Warm-up at the same rate fills the connection pools; its latencies are dropped.
        for measured_duration, keep in ((warmup, False), (duration, True)):
            latencies: list[float] = []
            errors: list[int] = []
            count = int(rate * measured_duration)
            start = time.perf_counter() + 0.05
            tasks = []
            for i in range(count):
                scheduled = start + i / rate
                # Create tasks a little ahead of their time so the loop is never behind on them.
                ahead = scheduled - time.perf_counter() - 0.02
                if ahead > 0:
                    await asyncio.sleep(ahead)
                tasks.append(asyncio.ensure_future(one(session, url, scheduled, latencies,
                                                       errors)))
            await asyncio.gather(*tasks)
            if keep:
                elapsed = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=1000)
    return {"rate": rate, "achieved_rps": len(latencies) / elapsed, "requests": len(latencies),
            "p50_ms": cuts[499] * 1000, "p90_ms": cuts[899] * 1000, "p99_ms": cuts[989] * 1000,
            "p999_ms": cuts[998] * 1000, "max_ms": max(latencies) * 1000, "errors": len(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    print(json.dumps(uvloop.run(run(args.url, args.rate, args.duration, args.warmup))))


if __name__ == "__main__":
    main()
