"""The hedging part: what hedging buys the time to first token, and what it costs upstream.

One fake upstream (this file run as `hedging.py upstream`, on core 1) serves many providers,
one per path (`/<name>/v1`): each streams its answer after a first-token delay of `FAST` s,
or `SLOW` s a share of the time (`SHARES`, by the provider's role), drawn from a generator
seeded by the role, so every gateway's leader meets the same sequence. The leader is the
issue's provider, 0.2 s or 3 s one time in ten, scaled down four times to keep the run short.

Gateways on core 0 route `bench-model` to their own leader, then a backup: one as slow as the
leader (its own draws: both slow at once one time in a hundred), or a steady one. One gateway
per backup and configuration (`CONFIGS`): no hedging, fixed `hedge_after` (one short, one
long), and `"p90"` with a budget above its 10 % and with the default 0.05. The client
(`hedging.py client`, core 1) sends each gateway `WARMUP` streams (a p90 learns from them),
then `requests` streams, `CONCURRENCY` at a time, timing each stream's first chunk. Reported:
p50/p95/p99 time to first token, the share of slow first tokens (over half of `SLOW`), the
share of streams hedged, and upstream requests per answer (counted by the upstream, warm-up
apart). Reported, not judged.

Run alone: `.venv/bin/python bench/run.py --only hedging`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import urllib.request
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
    spawn,
    stop,
    wait_for_port,
)
from scenarios import CHAT, Started, on_core1

FAST, SLOW = 0.05, 0.75
# Per role, the share of slow first tokens: the leader, a backup as slow, a steady backup.
SHARES = {"a": 0.1, "b": 0.1, "s": 0.0}
BACKUPS = {"as slow": "b", "steady": "s"}
CONCURRENCY = 8
WARMUP = 40
# name: the alias's routing ({}: no hedging).
CONFIGS: dict[str, dict[str, object]] = {
    "none": {},
    "fixed 0.25 s": {"hedge_after": 0.25, "hedge_budget": 1},
    "fixed 0.03 s": {"hedge_after": 0.03, "hedge_budget": 1},
    "p90, budget 0.15": {"hedge_after": "p90", "hedge_budget": 0.15},
    "p90, budget 0.05": {"hedge_after": "p90"},
}
CHUNK = (b'data: {"id":"chatcmpl-h","object":"chat.completion.chunk","created":1700000000,'
         b'"model":"bench-upstream-model","choices":[{"index":0,"delta":{"content":"tok "},'
         b'"finish_reason":null}]}\n\n')
LAST = (b'data: {"id":"chatcmpl-h","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"bench-upstream-model","choices":[{"index":0,"delta":{},'
        b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


async def _chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    name = request.match_info["name"]
    app = request.app
    app["counts"][name] = app["counts"].get(name, 0) + 1
    role = name.rsplit("-", 1)[-1]
    draws = app["draws"].setdefault(name, random.Random(role))
    await asyncio.sleep(SLOW if draws.random() < SHARES[role] else FAST)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(CHUNK * 4 + LAST)
    return response


async def _counts(request: web.Request) -> web.Response:
    return web.json_response(request.app["counts"])


def serve_upstream(port: int) -> None:
    app = web.Application()
    app["counts"], app["draws"] = {}, {}
    app.router.add_post("/{name}/v1/chat/completions", _chat)
    app.router.add_get("/counts", _counts)
    web.run_app(app, host="127.0.0.1", port=port, print=None, loop=uvloop.new_event_loop())


async def _stream(session: aiohttp.ClientSession, url: str) -> tuple[float, bool]:
    """One stream read to its end: its time to first chunk, and whether it was hedged."""
    body = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}],
            "stream": True}
    started = time.perf_counter()
    first = None
    async with session.post(url, json=body) as response:
        async for line in response.content:
            if first is None and line.startswith(b"data: "):
                first = time.perf_counter() - started
        hedged = response.headers.get("x-llms-hedged") == "1"
    if first is None:
        raise RuntimeError(f"no chunk from {url} ({response.status})")
    return first, hedged


async def _load(url: str, requests: int) -> list[tuple[float, bool]]:
    queue = iter(range(requests))
    got: list[tuple[float, bool]] = []
    async with aiohttp.ClientSession() as session:
        async def worker() -> None:
            for _ in queue:
                got.append(await _stream(session, url))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return got


async def _client(url: str, requests: int) -> dict[str, Any]:
    got = await _load(url, requests)
    ttft = [first for first, _ in got]
    return {"p50_ms": percentile(ttft, 0.5) * 1000, "p95_ms": percentile(ttft, 0.95) * 1000,
            "p99_ms": percentile(ttft, 0.99) * 1000,
            "slow": sum(first > SLOW / 2 for first in ttft) / len(ttft),
            "hedged": sum(hedged for _, hedged in got) / len(got), "answers": len(got)}


def _counts_of(port: int) -> dict[str, int]:
    """Requests the upstream has had so far, per provider path."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/counts", timeout=10) as response:
        return dict(json.loads(response.read()))


def hedging(work: Path, requests: int) -> dict[str, Any]:
    """Every configuration against the same 1-in-10 slow leader, one after the other, with
    each backup."""
    rows = []
    with Started(work) as started:
        upstream = free_port()
        process = spawn([PY, str(BENCH / "hedging.py"), "upstream", "--port", str(upstream)],
                        1, work / "hedging-upstream.log")
        started.processes.append(process)
        wait_for_port(upstream, process)
        plans = [(backup, name, routing) for backup in BACKUPS
                 for name, routing in CONFIGS.items()]
        for number, (backup, name, routing) in enumerate(plans):
            roles = ("a", BACKUPS[backup])
            providers = {role: {"type": "openai", "api_key": "bench-key",
                                "base_url": f"http://127.0.0.1:{upstream}/g{number}-{role}/v1",
                                "models": {"bench-model": "bench-upstream-model"}}
                         for role in roles}
            config, port = work / f"hedging-{number}.json", free_port()
            config.write_text(json.dumps({"server": {"host": "127.0.0.1"},
                                          "providers": providers,
                                          "models": {"bench-model": {"routing": routing}}}))
            gateway = spawn(gateway_command(config, port), 0, work / f"hedging-{number}.log")
            started.processes.append(gateway)
            wait_for_port(port, gateway)
            url = f"http://127.0.0.1:{port}{CHAT}"
            on_core1("hedging.py", "client", "--url", url, "--requests", WARMUP)
            before = _counts_of(upstream)  # the warm-up's are not the measured answers'
            result = on_core1("hedging.py", "client", "--url", url, "--requests", requests)
            after = _counts_of(upstream)
            sent = sum(after.get(f"g{number}-{r}", 0) - before.get(f"g{number}-{r}", 0)
                       for r in roles)
            rows.append({"backup": backup, "config": name, "routing": routing, **result,
                         "upstream_per_answer": sent / result["answers"]})
            print(f"  {backup:<8} {name:<18} {json.dumps(rows[-1])}", flush=True)
            stop(gateway)
    out = {"requests": requests, "fast_s": FAST, "slow_s": SLOW, "slow_share": SHARES["a"],
           "concurrency": CONCURRENCY, "warmup": WARMUP, "rows": rows}
    print(hedging_table(out), flush=True)
    return out


def hedging_table(part: dict[str, Any]) -> str:
    """Per backup and configuration: time to first token, slow and hedged shares, upstream
    requests per answer."""
    rows = [f"{part['requests']} streams per configuration after {part['warmup']} to warm up, "
            f"{part['concurrency']} at a time; the leader's first token after "
            f"{part['fast_s']:g} s, or {part['slow_s']:g} s one time in "
            f"{round(1 / part['slow_share'])}", "",
            "| backup | hedging | TTFT p50 ms | p95 ms | p99 ms | slow | hedged "
            "| upstream requests per answer |", "|---|---|---|---|---|---|---|---|"]
    rows += [f"| {row['backup']} | {row['config']} | {row['p50_ms']:.0f} | "
             f"{row['p95_ms']:.0f} | {row['p99_ms']:.0f} | {row['slow']:.1%} | "
             f"{row['hedged']:.1%} | {row['upstream_per_answer']:.2f} |"
             for row in part["rows"]]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("upstream", "client"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--url")
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port)
    else:
        print(json.dumps(uvloop.run(_client(args.url, args.requests))))


if __name__ == "__main__":
    main()
