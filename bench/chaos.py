"""The chaos part: do breakers cost answers when upstreams flap?

Three fake upstreams (this file run as `chaos.py upstream`, on core 1) each switch every
`FLIP` s, counted from one epoch shared by the three, to a mode drawn from its own seed (so
every run plays the same script): healthy, 5xx, 429 (with
`Retry-After: 1`), hang, cut (half a body, then the connection dropped) or garbage (200 with a
body that is not JSON). Two gateways on core 0 route one alias to all three in the same order:
one with the default `circuit` settings (breakers on), one with `circuit.enabled: false`.

The client (`chaos.py client`, on core 1) sends `requests` whole chat requests, `CONCURRENCY` at
a time, each one to both gateways at the same moment, so both face the same upstream modes.
Timeouts are short (first token 1 s, total 3 s) so a run takes about a minute. Reported: each
gateway's answered share and its failures' most common messages. Reported, not judged.

Run alone: `.venv/bin/python bench/run.py --only chaos`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from harness import BENCH, PY, free_port, provider, spawn, wait_for_port
from scenarios import CHAT, Started, on_core1

MODES = ("healthy", "5xx", "429", "hang", "cut", "garbage")
FLIP = 0.3  # seconds each mode lasts
CONCURRENCY = 10
TIMEOUTS = {"connect": 1, "first_token": 1, "idle": 1, "total": 3}
ANSWER = {"id": "chatcmpl-chaos", "object": "chat.completion", "created": 0,
          "model": "bench-upstream-model",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def mode_at(seed: int, elapsed: float) -> str:
    """The mode of upstream `seed` `elapsed` seconds after the epoch: the same in every run."""
    return random.Random(seed * 1_000_003 + int(elapsed / FLIP)).choice(MODES)


async def _chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    mode = mode_at(request.app["seed"], time.time() - request.app["epoch"])
    if mode == "healthy":
        return web.json_response(ANSWER)
    if mode == "5xx":
        return web.json_response({"error": {"message": "upstream overloaded",
                                            "type": "server_error"}}, status=503)
    if mode == "429":
        return web.json_response({"error": {"message": "rate limit reached",
                                            "type": "rate_limit_error"}}, status=429,
                                 headers={"Retry-After": "1"})
    if mode == "hang":
        await asyncio.sleep(3600)
    if mode == "cut":
        body = json.dumps(ANSWER).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "Content-Length": str(len(body))})
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        if request.transport is not None:
            request.transport.abort()
        return response
    return web.Response(body=b"<html>502 Bad Gateway</html>", content_type="application/json")


def serve_upstream(port: int, seed: int, epoch: float) -> None:
    app = web.Application()
    app["seed"], app["epoch"] = seed, epoch
    app.router.add_post("/v1/chat/completions", _chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, loop=uvloop.new_event_loop())


async def _one(session: aiohttp.ClientSession, url: str) -> tuple[bool, str]:
    body = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with session.post(url, json=body) as response:
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return False, f"client: {type(exc).__name__}"
    if not isinstance(data, dict):
        return False, f"{response.status} not a JSON object"
    if response.status == 200 and data.get("choices"):
        return True, "answered"
    message = str((data.get("error") or {}).get("message", ""))[:120]
    return False, f"{response.status} {message}"


async def _client(urls: dict[str, str], requests: int) -> dict[str, Any]:
    """Each request to every gateway at once; CONCURRENCY pairs in flight."""
    outcomes: dict[str, list[tuple[bool, str]]] = {name: [] for name in urls}
    queue = iter(range(requests))
    timeout = aiohttp.ClientTimeout(total=60)
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def worker() -> None:
            for _ in queue:
                pair = await asyncio.gather(*(_one(session, url) for url in urls.values()))
                for name, outcome in zip(urls, pair, strict=True):
                    outcomes[name].append(outcome)

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    wall = time.perf_counter() - started
    return {name: {"answered": sum(ok for ok, _ in got), "requests": len(got),
                   "failures": Counter(why for ok, why in got if not ok).most_common(5)}
            for name, got in outcomes.items()} | {"wall_s": wall}


def chaos(work: Path, requests: int) -> dict[str, Any]:
    """The flapping scenario with breakers on and off, side by side."""
    circuits: dict[str, dict[str, object]] = {"on": {}, "off": {"enabled": False}}
    epoch = time.time() + 10  # the script starts once everything is up
    with Started(work) as started:
        ports = []
        for seed in range(3):
            port = free_port()
            process = spawn([PY, str(BENCH / "chaos.py"), "upstream", "--port", str(port),
                             "--seed", str(seed), "--epoch", str(epoch)], 1,
                            work / f"chaos-upstream-{seed}.log")
            started.processes.append(process)
            wait_for_port(port, process)
            ports.append(port)
        urls = {}
        for name, circuit in circuits.items():
            providers = {f"p{seed}": provider(port, timeouts=TIMEOUTS, circuit=circuit)
                         for seed, port in enumerate(ports)}
            port, _ = started.gateway(ports[0], providers, name=f"chaos-{name}")
            urls[name] = f"http://127.0.0.1:{port}{CHAT}"
        time.sleep(max(0.0, epoch - time.time()))
        result = on_core1("chaos.py", "client", "--on", urls["on"], "--off", urls["off"],
                          "--requests", requests)
    out = {"requests": requests, "flip_s": FLIP, "modes": list(MODES),
           "concurrency": CONCURRENCY, "timeouts": TIMEOUTS, "wall_s": result["wall_s"],
           "on": result["on"], "off": result["off"],
           "on_rate": result["on"]["answered"] / requests,
           "off_rate": result["off"]["answered"] / requests}
    print(chaos_table(out), flush=True)
    return out


def chaos_table(part: dict[str, Any]) -> str:
    """Both gateways' answered shares, and what their failures said."""
    rows = [f"{part['requests']} requests, three upstreams flapping every {part['flip_s']:g} s "
            f"among {', '.join(part['modes'])}; {part['concurrency']} at a time, "
            f"{part['wall_s']:.0f} s", "",
            "| circuit | answered | most common failures |", "|---|---|---|"]
    for name, label in (("on", "breakers on (defaults)"), ("off", "`enabled: false`")):
        side = part[name]
        failures = "; ".join(f"{count}: {why}" for why, count in side["failures"]) or "none"
        rows.append(f"| {label} | {side['answered']} of {side['requests']} "
                    f"({side['answered'] / side['requests']:.0%}) | {failures} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("upstream", "client"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=float, default=0.0, help="when the script starts")
    parser.add_argument("--on")
    parser.add_argument("--off")
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    if args.role == "upstream":
        serve_upstream(args.port, args.seed, args.epoch)
        return
    print(json.dumps(uvloop.run(_client({"on": args.on, "off": args.off}, args.requests))))


if __name__ == "__main__":
    main()
