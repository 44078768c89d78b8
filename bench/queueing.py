"""The queueing part: an interactive key's wait beside a batch burst, at the concurrency limit.

One upstream on core 1 answers every whole request after `SERVICE` seconds (`queueing.py
upstream`). One gateway on core 0 with `server.max_concurrency` `SLOTS` and two keys: `batch`
(priority 0) and `interactive` (priority 5). Per round, on core 1, `BATCH` requests of the batch
key are sent at once, then `INTERACTIVE` of the interactive key right behind them (the hard case:
they arrive last), every request timed from its send to its answer; its wait in the queue is that
time less the upstream's `SERVICE`.

Two arrangements, alternating rounds in one run:
- fair: each key its own (what the gateway does: round robin between keys);
- shared: every request under the batch key, the interactive ones with `x-llms-priority: 0`,
  so they queue first come first served behind the burst (what one queue without keys would do).

Reported: the interactive key's p95 wait against the batch key's median wait (the issue's
target: below it), and every request answered. Run alone: `bench/run.py --only queueing`.
"""

from __future__ import annotations

import argparse
import asyncio
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

SLOTS = 10
BATCH = 200
INTERACTIVE = 20
SERVICE = 0.05  # seconds the upstream takes per request
BATCH_KEY, CHAT_KEY = "bench-batch-key-0123456789", "bench-chat-key-0123456789"
ANSWER = json.dumps({"id": "chatcmpl-q", "object": "chat.completion", "created": 1700000000,
                     "model": "bench-upstream-model",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": "ok"}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                               "total_tokens": 2}}).encode()


async def _answer(request: web.Request) -> web.Response:
    await request.read()
    await asyncio.sleep(SERVICE)
    return web.Response(body=ANSWER, content_type="application/json")


def serve_upstream(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, loop=uvloop.new_event_loop())


async def _timed(session: aiohttp.ClientSession, url: str, key: str,
                 headers: dict[str, str]) -> tuple[float, int]:
    body = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}
    started = time.perf_counter()
    async with session.post(url, json=body,
                            headers={"Authorization": f"Bearer {key}", **headers}) as response:
        await response.read()
        return time.perf_counter() - started, response.status


async def _burst(url: str, shared: bool) -> dict[str, Any]:
    """One round: the batch burst, the interactive requests right behind it."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        batch = [asyncio.create_task(_timed(session, url, BATCH_KEY, {})) for _ in range(BATCH)]
        await asyncio.sleep(0)  # the burst's sends start first
        interactive = [asyncio.create_task(_timed(
            session, url, BATCH_KEY if shared else CHAT_KEY,
            {"x-llms-priority": "0"} if shared else {})) for _ in range(INTERACTIVE)]
        done_batch = await asyncio.gather(*batch)
        done_interactive = await asyncio.gather(*interactive)
    waits_b = sorted(max(0.0, t - SERVICE) for t, _ in done_batch)
    waits_i = sorted(max(0.0, t - SERVICE) for t, _ in done_interactive)
    statuses = [s for _, s in done_batch + done_interactive]
    return {"interactive_p95_s": percentile(waits_i, 0.95),
            "interactive_median_s": statistics.median(waits_i),
            "batch_median_s": statistics.median(waits_b), "batch_max_s": waits_b[-1],
            "answered": statuses.count(200), "requests": len(statuses)}


def queueing(work: Path, rounds: int) -> dict[str, Any]:
    """Fair and shared rounds, alternating; the interactive p95 wait against the batch
    median in each."""
    with Started(work) as started:
        upstream = free_port()
        process = spawn([PY, str(BENCH / "queueing.py"), "upstream", "--port", str(upstream)],
                        1, work / "queueing-upstream.log")
        started.processes.append(process)
        wait_for_port(upstream, process)
        config, port = work / "queueing.json", free_port()
        config.write_text(json.dumps({
            "server": {"host": "127.0.0.1", "max_concurrency": SLOTS, "max_queue": 1000,
                       "queue_timeout": 120,
                       "api_keys": [{"key": BATCH_KEY, "id": "batch"},
                                    {"key": CHAT_KEY, "id": "interactive", "priority": 5}]},
            "providers": {"fake": provider(upstream)}}))
        gateway = spawn(gateway_command(config, port), 0, work / "queueing-gateway.log")
        started.processes.append(gateway)
        wait_for_port(port, gateway)
        url = f"http://127.0.0.1:{port}{CHAT}"
        rows: dict[str, list[dict[str, Any]]] = {"fair": [], "shared": []}
        for round_ in range(rounds * 2):
            arrangement = ("fair", "shared")[round_ % 2]
            rows[arrangement].append(on_core1("queueing.py", "burst", "--url", url,
                                              *(["--shared"] if arrangement == "shared" else [])))
    out: dict[str, Any] = {"slots": SLOTS, "batch": BATCH, "interactive": INTERACTIVE,
                           "service_s": SERVICE, "rounds": rows}
    for arrangement, runs in rows.items():
        for measure in ("interactive_p95_s", "batch_median_s"):
            out[f"{arrangement}_{measure}"] = statistics.median(r[measure] for r in runs)
        out[f"{arrangement}_answered"] = sum(r["answered"] for r in runs)
        out[f"{arrangement}_requests"] = sum(r["requests"] for r in runs)
    print(queueing_table(out), flush=True)
    return out


def queueing_table(part: dict[str, Any]) -> str:
    lines = [f"{part['batch']} batch requests, then {part['interactive']} interactive, at "
             f"max_concurrency {part['slots']}, upstream {part['service_s'] * 1000:.0f} ms each",
             "", "| arrangement | interactive p95 wait | batch median wait | answered |",
             "|---|---|---|---|"]
    for arrangement in ("fair", "shared"):
        lines.append(f"| {arrangement} | {part[f'{arrangement}_interactive_p95_s'] * 1000:.0f} ms "
                     f"| {part[f'{arrangement}_batch_median_s'] * 1000:.0f} ms "
                     f"| {part[f'{arrangement}_answered']}/{part[f'{arrangement}_requests']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("upstream", "burst"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--url")
    parser.add_argument("--shared", action="store_true")
    args = parser.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port)
    else:
        print(json.dumps(uvloop.run(_burst(args.url, args.shared))))


if __name__ == "__main__":
    main()
