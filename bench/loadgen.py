"""A closed-loop Python load generator, used when wrk is not available.

N workers each send the next request as soon as the previous answer arrives, for a fixed
duration; prints req/s, p50 and p99 as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp
import uvloop

BODY = json.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 16}).encode()


async def post_chat(session: aiohttp.ClientSession, url: str, errors: list[int]) -> None:
    """One chat completion, read whole; a non-200 status (or 0 for a transport error) noted."""
    try:
        async with session.post(url, data=BODY,
                                headers={"Content-Type": "application/json"}) as response:
            await response.read()
            if response.status != 200:
                errors.append(response.status)
    except aiohttp.ClientError:
        errors.append(0)


async def worker(session: aiohttp.ClientSession, url: str, until: float,
                 latencies: list[float], errors: list[int]) -> None:
    while time.perf_counter() < until:
        started = time.perf_counter()
        await post_chat(session, url, errors)
        latencies.append(time.perf_counter() - started)


async def run(url: str, concurrency: int, duration: float) -> dict[str, float]:
    latencies: list[float] = []
    errors: list[int] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        until = started + duration
        await asyncio.gather(*(worker(session, url, until, latencies, errors)
                               for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {"rps": len(latencies) / elapsed, "p50_ms": cuts[49] * 1000,
            "p99_ms": cuts[98] * 1000, "errors": len(errors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    print(json.dumps(uvloop.run(run(args.url, args.concurrency, args.duration))))


if __name__ == "__main__":
    main()
