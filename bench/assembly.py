"""The assembly part: one whole chat answer of many events, assembled by the gateway.

A non-streamed chat request is sent upstream as a stream and its events assembled into the
whole answer (gateway/adapters/assemble.py). This part asks for one answer of `events` events (one
token `a` each, with its logprobs entry; `fake_upstream.py --logprobs`) and times it:

- assembled: ONE non-streamed request with `logprobs: true` through the gateway, while the same
  client process polls `GET /health` every 50 ms (is the gateway's event loop free meanwhile?);
- relayed: the same request with `"stream": true`, the same events relayed (the baseline);

in `rounds` rounds, relayed then assembled. Reported: each request's wall time, whether the
answer is complete (its content `events` characters long, `events` logprobs entries), /health
p50 and max during it, the gateway's CPU seconds and the share of its core (core 0) other
processes took meanwhile (this machine is shared: wall time counts their load, CPU seconds
less so), and assembled/relayed as ratios of wall time and of gateway CPU. The
provider's `max_answer_bytes` is raised for the answer, and `max_answer_events` set above
`events` when the config knows the key (checked in the code the gateway runs).

Run alone: `.venv/bin/python bench/run.py --only assembly`. As a script
(`assembly.py --url URL [--stream]`, run on core 1 by the part) it is the client: one request
with the /health poller, JSON on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from fake_upstream import logprob_body
from harness import PY, ROOT, cpu_seconds, provider
from scenarios import CHAT, CpuShare, Started, on_core1

POLL = 0.05  # seconds between /health polls, each started this long after the one before
IDLE = 1.0  # seconds of /health polls with no request, for context


def _ms_stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": 0.0, "max": 0.0}
    return {"p50": statistics.median(values), "max": max(values)}


async def _poll_health(session: aiohttp.ClientSession, url: str, stop: asyncio.Event,
                       latencies: list[float], failures: list[int]) -> None:
    """GET `url` every POLL s until `stop`, each latency in ms (a slow one delays the next)."""
    tick = time.perf_counter()
    while not stop.is_set():
        began = time.perf_counter()
        try:
            async with session.get(url) as response:
                await response.read()
                if response.status != 200:
                    failures.append(response.status)
        except aiohttp.ClientError:
            failures.append(0)
        latencies.append((time.perf_counter() - began) * 1000)
        tick += POLL
        wait = tick - time.perf_counter()
        if wait <= 0:
            tick = time.perf_counter()
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


def _check_whole(body: bytes) -> dict[str, Any]:
    answer = json.loads(body)
    choice = answer["choices"][0]
    logprobs = (choice.get("logprobs") or {}).get("content") or []
    return {"content_chars": len(choice["message"].get("content") or ""),
            "logprobs_entries": len(logprobs), "finish_reason": choice.get("finish_reason"),
            "completion_tokens": (answer.get("usage") or {}).get("completion_tokens")}


def _check_stream(body: bytes) -> dict[str, Any]:
    content, entries, finish, tokens, events = [], 0, None, None, 0
    for event in body.split(b"\n\n"):
        for line in event.split(b"\n"):
            data = line.strip()[5:].strip() if line.strip().startswith(b"data:") else b""
            if not data or data == b"[DONE]":
                continue
            chunk = json.loads(data)
            events += 1
            for choice in chunk.get("choices") or ():
                content.append((choice.get("delta") or {}).get("content") or "")
                entries += len((choice.get("logprobs") or {}).get("content") or ())
                finish = choice.get("finish_reason") or finish
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return {"content_chars": len("".join(content)), "logprobs_entries": entries,
            "finish_reason": finish, "completion_tokens": tokens, "events": events}


async def _client(url: str, health_url: str, stream: bool | None) -> dict[str, Any]:
    """One request (none when `stream` is None: IDLE s of polls alone) with the poller."""
    latencies: list[float] = []
    failures: list[int] = []
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session, \
            aiohttp.ClientSession(timeout=timeout) as health:
        poller = asyncio.create_task(_poll_health(health, health_url, stop, latencies, failures))
        out: dict[str, Any] = {}
        began = time.perf_counter()
        if stream is None:
            await asyncio.sleep(IDLE)
        else:
            request = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}],
                       "logprobs": True, "stream": stream}
            async with session.post(url, json=request) as response:
                out["status"] = response.status
                parts = [piece async for piece in response.content.iter_any()]
        out["wall_s"] = time.perf_counter() - began
        stop.set()
        await poller
    if stream is not None:
        body = b"".join(parts)
        out["response_bytes"] = len(body)
        if out["status"] != 200:
            out["error"] = body[:500].decode(errors="replace")
        else:
            out.update(_check_stream(body) if stream else _check_whole(body))
    health_ms = _ms_stats(latencies)
    return {**out, "health_polls": len(latencies), "health_failures": len(failures),
            "health_p50_ms": health_ms["p50"], "health_max_ms": health_ms["max"]}


def _accepts_max_answer_events() -> bool:
    """Whether the gateway's code (the one under ROOT, as the gateway imports it) has a
    provider `max_answer_events` key; unknown provider keys are ignored, not refused."""
    check = ("from providers.contract.spec import ProviderEntry; "
             "print('max_answer_events' in ProviderEntry.__struct_fields__)")
    output = subprocess.run([PY, "-c", check], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    return output.strip() == "True"


def _code() -> str:
    """The commit the gateway's code is at, `+dirty` when gateway/ or providers/ differ."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "gateway", "providers") else "")


def _complete(run: dict[str, Any], events: int) -> bool:
    return (run.get("status") == 200 and run.get("content_chars") == events
            and run.get("logprobs_entries") == events)


def assembly(work: Path, events: int, rounds: int) -> dict[str, Any]:
    """`rounds` of the relayed stream then the assembled whole answer, `events` events each."""
    size = len(logprob_body(events))
    extra: dict[str, object] = {"stream_upstream": True, "max_answer_bytes": 4 * size}
    if _accepts_max_answer_events():
        extra["max_answer_events"] = 2 * events
    runs: list[dict[str, Any]] = []
    with Started(work) as started:
        upstream = started.upstream("--chunks", events, "--logprobs")
        port, process = started.gateway(upstream, {"fake": provider(upstream, **extra)},
                                        name="assembly")
        url, health = f"http://127.0.0.1:{port}{CHAT}", f"http://127.0.0.1:{port}/health"
        idle = on_core1("assembly.py", "--url", url, "--health", health, "--idle")
        for i in range(rounds):
            round_: dict[str, Any] = {"round": i}
            for name, flag in (("relayed", ("--stream",)), ("assembled", ())):
                cpu = cpu_seconds(process.pid)
                with CpuShare(process.pid) as share:
                    round_[name] = on_core1("assembly.py", "--url", url, "--health", health,
                                            *flag)
                round_[name].update(share.result, gateway_cpu_s=cpu_seconds(process.pid) - cpu)
                round_[name]["complete"] = _complete(round_[name], events)
            round_["ratio"] = round_["assembled"]["wall_s"] / round_["relayed"]["wall_s"]
            round_["cpu_ratio"] = (round_["assembled"]["gateway_cpu_s"]
                                   / max(round_["relayed"]["gateway_cpu_s"], 0.01))
            runs.append(round_)
        alive = process.poll() is None

    def med(name: str, key: str) -> float:
        return float(statistics.median(r[name][key] for r in runs))

    out = {"events": events, "rounds": rounds, "upstream_body_bytes": size,
           "max_answer_bytes": extra["max_answer_bytes"],
           "max_answer_events": extra.get("max_answer_events"), "code": _code(),
           "assembled_s": med("assembled", "wall_s"), "relayed_s": med("relayed", "wall_s"),
           "ratio": float(statistics.median(r["ratio"] for r in runs)),
           "cpu_ratio": float(statistics.median(r["cpu_ratio"] for r in runs)),
           "health_p50_ms": med("assembled", "health_p50_ms"),
           "health_max_ms": max(r["assembled"]["health_max_ms"] for r in runs),
           "relayed_health_p50_ms": med("relayed", "health_p50_ms"),
           "relayed_health_max_ms": max(r["relayed"]["health_max_ms"] for r in runs),
           "idle_health_p50_ms": idle["health_p50_ms"], "idle_health_max_ms": idle["health_max_ms"],
           "assembled_cpu_s": med("assembled", "gateway_cpu_s"),
           "relayed_cpu_s": med("relayed", "gateway_cpu_s"),
           "assembled_core0_others": med("assembled", "core0_others_fraction"),
           "complete": all(r[n]["complete"] for r in runs for n in ("assembled", "relayed")),
           "gateway_alive_after": alive, "runs": runs}
    print(assembly_table(out), flush=True)
    return out


def assembly_table(part: dict[str, Any]) -> str:
    """Each round's requests, then the medians."""
    events = part["events"]
    rows = [f"one chat answer of {events:,} logprob events (upstream body "
            f"{part['upstream_body_bytes'] / 2**20:.1f} MiB; max_answer_events "
            f"{part['max_answer_events'] or 'not a config key'}; code {part['code']}); "
            f"/health polled every {POLL * 1000:.0f} ms, idle p50 "
            f"{part['idle_health_p50_ms']:.2f} / max {part['idle_health_max_ms']:.2f} ms", "",
            "| round | request | wall s | complete | content chars | /health p50 ms "
            "| /health max ms | polls | gateway CPU s | core 0 others |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in part["runs"]:
        for name in ("relayed", "assembled"):
            m = r[name]
            rows.append(f"| {r['round']} | {name} | {m['wall_s']:.2f} | "
                        f"{'yes' if m['complete'] else 'NO'} | {m.get('content_chars', '-')} | "
                        f"{m['health_p50_ms']:.2f} | {m['health_max_ms']:.2f} | "
                        f"{m['health_polls']} | {m['gateway_cpu_s']:.2f} | "
                        f"{m['core0_others_fraction']:.0%} |")
    rows += ["", f"assembled {part['assembled_s']:.2f} s, relayed {part['relayed_s']:.2f} s: "
             f"assembled/relayed {part['ratio']:.2f}x (medians of {part['rounds']} rounds); "
             f"/health during assembly p50 {part['health_p50_ms']:.2f} ms, max "
             f"{part['health_max_ms']:.2f} ms; gateway CPU {part['assembled_cpu_s']:.2f} s "
             f"assembled, {part['relayed_cpu_s']:.2f} s relayed ({part['cpu_ratio']:.1f}x); "
             f"complete: "
             f"{'yes' if part['complete'] else 'NO'}"]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--health", required=True, help="the gateway's /health URL")
    parser.add_argument("--stream", action="store_true", help="ask for the stream, relayed")
    parser.add_argument("--idle", action="store_true", help=f"no request: {IDLE:g} s of polls")
    args = parser.parse_args()
    stream = None if args.idle else args.stream
    print(json.dumps(uvloop.run(_client(args.url, args.health, stream))))


if __name__ == "__main__":
    main()
