"""`make bench`: the gateway against a direct call and a minimal aiohttp proxy, in one run.

The target under test runs pinned to core 0; the fake upstream and the load generator share
core 1. Parts (`--only NAME`, repeatable; all by default):

- throughput: closed-loop req/s at 1, 10 and 50 clients, direct / minimal proxy / gateway, with
  wrk (installed from Debian if missing) or, failing that, a Python load generator; then paired
  rounds at 50 clients, minimal proxy then gateway;
- latency: open-loop load at a fixed 500 req/s, direct, byte forwarder (byte_forwarder.py: the
  socket floor), minimal proxy and gateway in turn, 4 rounds;
- stages: the same load on the gateway under the stage probe (stages.py): where a request's
  time goes inside it;
- streaming: 100 concurrent 200-chunk streams, per-chunk timings direct / minimal / gateway;
- capacity: 5,000 concurrent slow streams through the gateway, its peak RSS;
- failover: primary refuses connections, vs the secondary alone, at 1 client;
- startup: spawn to /health 200, and idle RSS, with no pool provider;
- whole_streamed: whole requests relayed whole vs asked upstream as a stream and assembled
  (early failover's cost), paired rounds at 10 clients;
- assembly: one whole chat answer of 100,000 logprob events assembled by the gateway, vs the same
  events relayed as a stream, with /health polled meanwhile (assembly.py);
- chaos: three upstreams flapping every 0.3 s among healthy, 5xx, 429, hang, cut and garbage,
  400 requests to a gateway with breakers on and one with `circuit.enabled: false` (chaos.py);
- resume: a stream cut halfway and resumed by another candidate, the seam's latency against the
  gap between chunks; streams/s of an alias with resume on (never needed) against one without,
  alternating rounds (resume.py);
- tracing: req/s at 50 clients without any tracing code, with tracing off, and with tracing on
  exporting to a local OTLP receiver, paired rounds (traced.py);
- queueing: 200 requests of a batch key then 20 of an interactive key at max_concurrency 10,
  the interactive key's p95 wait against the batch key's median, each key its own (fair) and
  all under one key (first come first served), alternating rounds (queueing.py);
- hedging: a provider slow to its first token one time in ten, through no hedging, a fixed
  `hedge_after` (short and long) and `"p90"` (with two budgets): p99 time to first token and
  upstream requests per answer (hedging.py);
- realtime: 20 Realtime sessions at once sending 4 KiB frames, each echoed by the upstream:
  round trip per frame and frames/s, direct against through the gateway (realtime.py).
- semantic: semantic cache hits (a paraphrase, its embedding asked of a local fake) against exact
  cache hits on the same gateway, req/s and p50 at 10 clients, alternating rounds (semantic.py).
- request_log: req/s at 50 clients with the request log on (metadata) against off, paired
  rounds of two gateways (request_log.py).
- mcp: an MCP tool call through the gateway's `/mcp` against calling the upstream MCP server
  directly, the SDK's client one call at a time: p50 and p99, alternating rounds
  (mcp_tools.py).

Every target is a ratio or a comparison against references measured in the same run (the
minimal proxy above all), never an absolute time: this machine is shared and noisy. The one
absolute kept is failover's 2 ms. Results print as tables and are saved as JSON under
bench/results/; a full run (not --only, not --quick) then renders docs/benchmarks.md's tables
from that JSON. `render [FILE]` re-renders from a saved result (the newest full run by default).

The regression guard: the run prints the targets it missed, and exits non-zero when the req/s
ratio at 50 clients is under 0.85 (so `make bench` fails).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import accounts
import guardrails
import request_log
import scenarios
import semantic
import stages
import traced
from assembly import assembly
from chaos import chaos
from harness import (
    BENCH,
    PY,
    ROOT,
    free_port,
    gateway_command,
    gateway_config,
    provider,
    raise_nofile,
    spawn,
    stop,
    wait_for_port,
)
from hedging import hedging
from mcp_tools import mcp_cost
from queueing import queueing
from realtime import realtime
from resume import resume

BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
LUA = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status, latency:percentile(50),
    latency:percentile(99)))
end
"""
PARTS = ("throughput", "curve", "latency", "stages", "streaming", "capacity", "failover",
         "startup", "whole_streamed", "assembly", "chaos", "resume", "tracing", "queueing",
         "hedging", "accounts", "realtime", "semantic", "guardrails", "request_log", "mcp")
PAIRED_CLIENTS = 50
CURVE_RATES = [250, 500, 1000, 1500, 2000, 2500, 3000]  # past ~3,000 req/s the load
# generator (Python, on core 1 with the upstream) is the limit, not the targets.
PLOT = ROOT / "docs" / "latency-vs-load.png"
DOC = ROOT / "docs" / "benchmarks.md"


@dataclass
class Measurement:
    """One target at one concurrency."""

    target: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def ensure_wrk() -> str | None:
    """wrk's path, installing Debian's package once if we can."""
    if not shutil.which("wrk") and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], capture_output=True,
                       check=False, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("wrk")


def run_wrk(wrk: str, url: str, concurrency: int, duration: float, script: Path) -> Measurement:
    command = ["taskset", "-c", "1", wrk, "-t1", f"-c{concurrency}", f"-d{duration:g}s",
               "--latency", "-s", str(script), url]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next(line for line in output.splitlines() if line.startswith("RESULT"))
    requests, micros, errors, non2xx, p50, p99 = (int(x) for x in line.split()[1:])
    return Measurement("", concurrency, requests / (micros / 1e6), p50 / 1000, p99 / 1000,
                       errors + non2xx)


def run_python(url: str, concurrency: int, duration: float) -> Measurement:
    output = subprocess.run(
        ["taskset", "-c", "1", PY, str(BENCH / "loadgen.py"), "--url", url,
         "--concurrency", str(concurrency), "--duration", str(duration)],
        capture_output=True, text=True, check=True).stdout
    result = json.loads(output)
    return Measurement("", concurrency, result["rps"], result["p50_ms"], result["p99_ms"],
                       result["errors"])


def measure(name: str, url: str, levels: list[int], duration: float, wrk: str | None,
            script: Path) -> list[Measurement]:
    results = []
    for concurrency in levels:
        # A short warm-up fills connection pools and caches before the measured run.
        if wrk:
            run_wrk(wrk, url, concurrency, 1, script)
            m = run_wrk(wrk, url, concurrency, duration, script)
        else:
            run_python(url, concurrency, 1)
            m = run_python(url, concurrency, duration)
        m.target = name
        results.append(m)
        print(f"  {name:<8} c={concurrency:<3} {m.rps:9.0f} req/s  p50 {m.p50_ms:7.2f} ms  "
              f"p99 {m.p99_ms:7.2f} ms  errors {m.errors}", flush=True)
    return results


def table(results: list[Measurement], levels: list[int]) -> str:
    by = {(m.target, m.concurrency): m for m in results}
    rows = ["| clients | direct req/s | minimal req/s | gateway req/s | gateway/minimal "
            "| added p50 ms | added p99 ms |", "|---|---|---|---|---|---|---|"]
    for c in levels:
        d, mn, g = by.get(("direct", c)), by.get(("minimal", c)), by.get(("gateway", c))
        if not (d and mn and g):
            continue
        rows.append(f"| {c} | {d.rps:,.0f} | {mn.rps:,.0f} | {g.rps:,.0f} | "
                    f"{g.rps / mn.rps:.2f} | {g.p50_ms - d.p50_ms:.2f} | "
                    f"{g.p99_ms - d.p99_ms:.2f} |")
    return "\n".join(rows)


def throughput(work: Path, levels: list[int], duration: float, wrk: str | None,
               rounds: int) -> tuple[list[Measurement], list[dict[str, float]]]:
    """Closed-loop req/s of direct, minimal proxy and gateway at each concurrency; then
    `rounds` of minimal and gateway in turn at 50 clients, whose per-round ratios decide the
    target (drift on a shared machine touches both sides of a round alike)."""
    script = work / "post.lua"
    script.write_text(LUA % json.dumps(BODY))
    upstream_port, minimal_port, gateway_port = free_port(), free_port(), free_port()
    config = work / "llms.json"
    gateway_config(upstream_port, config)
    processes = []
    results: list[Measurement] = []
    paired: list[dict[str, float]] = []
    try:
        upstream = spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port)], 1,
                         work / "upstream.log")
        processes.append(upstream)
        wait_for_port(upstream_port, upstream)
        results += measure("direct", f"http://127.0.0.1:{upstream_port}/v1/chat/completions",
                           levels, duration, wrk, script)

        # Both on core 0; the one not under load is idle.
        minimal = spawn([PY, str(BENCH / "minimal_proxy.py"), "--port", str(minimal_port),
                         "--upstream", f"http://127.0.0.1:{upstream_port}/v1"], 0,
                        work / "minimal.log")
        processes.append(minimal)
        gateway = spawn(gateway_command(config, gateway_port), 0, work / "gateway.log")
        processes.append(gateway)
        urls = {"minimal": f"http://127.0.0.1:{minimal_port}/v1/chat/completions",
                "gateway": f"http://127.0.0.1:{gateway_port}/v1/chat/completions"}
        # The gateway's framework and server without the gateway: Litestar + aiohttp on granian
        # (the gateway's settings) and on uvicorn, paired with it round by round too.
        for server in ("granian", "uvicorn"):
            port = free_port()
            process = spawn([PY, str(BENCH / "litestar_proxy.py"), "--port", str(port),
                             "--upstream", f"http://127.0.0.1:{upstream_port}/v1",
                             "--server", server], 0, work / f"litestar-{server}.log")
            processes.append(process)
            wait_for_port(port, process)
            urls[f"litestar_{server}"] = f"http://127.0.0.1:{port}/v1/chat/completions"
        wait_for_port(minimal_port, minimal)
        wait_for_port(gateway_port, gateway)
        for name, url in urls.items():
            results += measure(name, url, levels, duration, wrk, script)
        for _ in range(rounds):
            pair = {name: measure(name, url, [PAIRED_CLIENTS], duration, wrk, script)[0].rps
                    for name, url in urls.items()}
            paired.append({**pair, "ratio": pair["gateway"] / pair["minimal"],
                           "ratio_granian": pair["gateway"] / pair["litestar_granian"],
                           "ratio_uvicorn": pair["gateway"] / pair["litestar_uvicorn"]})
    finally:
        for process in processes:
            stop(process)
    return results, paired


ASSEMBLY_EVENTS = 100_000  # the assembly part's answer: one token and its logprobs an event
WHOLE_CHUNKS = 16  # the upstream's stream for a whole answer: one event per token of 16
WHOLE_RATIO = 0.75  # assembled from that stream, against relayed whole: req/s, at least


def _post_script(work: Path) -> Path:
    script = work / "post.lua"
    script.write_text(LUA % json.dumps(BODY))
    return script


def _body_script(work: Path, body: dict[str, Any]) -> Path:
    """`_post_script`'s request with another body."""
    script = work / f"post-{body['model']}.lua"
    script.write_text(LUA % json.dumps(body))
    return script


def _keyed_script(work: Path, key: str) -> Path:
    """`_post_script`'s request, sent with `key`."""
    script = work / f"post-{key[-8:]}.lua"
    script.write_text(LUA % json.dumps(BODY) + f'wrk.headers["Authorization"] = "Bearer {key}"\n')
    return script


def _body_script(work: Path, body: dict[str, Any]) -> Path:
    """A wrk script that posts `body` (a body with no single quote: the script quotes it)."""
    script = work / f"post-{body['model']}.lua"
    script.write_text(LUA % json.dumps(body))
    return script


def whole_streamed(work: Path, duration: float, wrk: str | None, rounds: int) -> dict[str, Any]:
    """The cost of early failover: whole requests relayed whole, against the same requests
    asked upstream as a stream of `WHOLE_CHUNKS` events and assembled, at 10 clients, in
    paired rounds (the two gateways in turn, on the same core)."""
    script = work / "post-whole.lua"
    script.write_text(LUA % json.dumps(BODY))
    upstream_port, whole_port, streamed_port = free_port(), free_port(), free_port()
    processes = []
    rows: list[dict[str, float]] = []
    try:
        upstream = spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port),
                          "--chunks", str(WHOLE_CHUNKS)], 1, work / "upstream-whole.log")
        processes.append(upstream)
        wait_for_port(upstream_port, upstream)
        urls = {}
        for name, port, streams in (("whole", whole_port, False),
                                    ("streamed", streamed_port, True)):
            config = work / f"llms-{name}.json"
            gateway_config(upstream_port, config,
                           {"fake": provider(upstream_port, stream_upstream=streams)})
            gateway = spawn(gateway_command(config, port), 0, work / f"gateway-{name}.log")
            processes.append(gateway)
            wait_for_port(port, gateway)
            urls[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
        for _ in range(rounds):
            pair = {name: measure(name, url, [10], duration, wrk, script)[0].rps
                    for name, url in urls.items()}
            rows.append({**pair, "ratio": pair["streamed"] / pair["whole"]})
    finally:
        for process in processes:
            stop(process)
    return {"rounds": rows, "chunks": WHOLE_CHUNKS,
            "ratio_median": statistics.median(r["ratio"] for r in rows)}


def run_parts(parts: list[str], quick: bool, levels: list[int], duration: float,
              wrk: str | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="llms-bench-"))
    # Every gateway of the run keeps its accounts database here: each run starts with an empty
    # spend table, as a new gateway does, and none leaves rows in the home directory.
    os.environ["LLMS_STATE_DIR"] = str(work / "state")
    repeats = 1 if quick else 3
    data: dict[str, Any] = {}
    if "throughput" in parts:
        measured, paired = throughput(work, levels, duration, wrk, 2 if quick else 5)
        data["results"], data["paired"] = [asdict(m) for m in measured], paired
        print("\n" + table(measured, levels) + "\n", flush=True)
    steps: dict[str, Callable[[], dict[str, Any]]] = {
        "curve": lambda: scenarios.load_curve(work, CURVE_RATES[1::3] if quick else CURVE_RATES,
                                              2 if quick else 4),
        # 4 rounds: the latency targets must hold in 3 of them.
        "latency": lambda: scenarios.latency_at_rate(work, 500, 3 if quick else 10,
                                                     1 if quick else 4),
        "stages": lambda: stages.gateway_stages(work, 500, 3 if quick else 10),
        "guardrails": lambda: {**guardrails.guardrails_cost(), "served": guardrails.served_cost(
            work, duration, 1 if quick else 3,
            lambda url, body, seconds: measure("guardrails", url, [guardrails.CLIENTS], seconds,
                                               wrk, _body_script(work, body))[0].rps)},
        # 20 s: ~1,200 streams a repeat, so a TTFT p99 is not the 5th-worst of ~490 streams.
        "streaming": lambda: scenarios.streaming(work, 100, 200, 0.01, 3 if quick else 20,
                                                 repeats),
        "capacity": lambda: (scenarios.capacity(work, 1000, 10, 1.0, 5) if quick
                             else scenarios.capacity(work, 5000, 20, 1.0, 10)),
        "failover": lambda: scenarios.failover(work, 2 if quick else 5, repeats),
        "startup": lambda: scenarios.startup(work, repeats),
        "whole_streamed": lambda: whole_streamed(work, duration, wrk, 2 if quick else 5),
        "assembly": lambda: assembly(work, ASSEMBLY_EVENTS, 1 if quick else 3),
        "chaos": lambda: chaos(work, 100 if quick else 400),
        "resume": lambda: resume(work, 3 if quick else 8, 2 if quick else 4),
        # 8 rounds: on this shared machine two gateways of the same code read ±25% apart in
        # a round (docs/benchmarks.md, 2026-11-26 06:xx); the median needs the rounds.
        "tracing": lambda: traced.tracing_cost(
            work, duration, 2 if quick else 8,
            lambda url, clients, seconds: measure("tracing", url, [clients], seconds, wrk,
                                                  _post_script(work))[0].rps),
        "queueing": lambda: queueing(work, 2 if quick else 4),
        "hedging": lambda: hedging(work, 200 if quick else 500),
        "realtime": lambda: realtime(work, 2 if quick else 3),
        "mcp": lambda: mcp_cost(work, 200 if quick else 1000, 2 if quick else 4),
        "accounts": lambda: accounts.accounts_cost(
            work, duration, 2 if quick else 5,
            lambda url, key, seconds: measure("accounts", url, [accounts.CLIENTS], seconds,
                                              wrk, _keyed_script(work, key))[0].rps),
        # wrk only: the Python load generator sends one fixed body.
        "semantic": lambda: semantic.semantic_cost(
            work, duration, 2 if quick else 3,
            lambda url, body, seconds: measure("semantic", url, [semantic.CLIENTS], seconds,
                                               wrk, _body_script(work, body))[0])
        if wrk else {"skipped": "needs wrk"},
        "request_log": lambda: request_log.request_log_cost(
            work, duration, 2 if quick else 6,
            lambda url, seconds: measure("request_log", url, [request_log.CLIENTS], seconds,
                                         wrk, _post_script(work))[0].rps),
    }
    for name, step in steps.items():
        if name in parts:
            print(f"{name} ...", flush=True)
            data[name] = step()
            print("  " + json.dumps({k: v for k, v in data[name].items()
                                     if not isinstance(v, list | dict)}), flush=True)
    return data


RATIO = 0.85  # the gateway's req/s at 50 clients against the Litestar proxy's on granian, at least
HELD = 0.75  # the share of latency rounds in which the gateway must be at or under the minimal
# proxy: 3 of 4 in a full run


def _held_needed(rounds: int) -> int:
    return math.ceil(HELD * rounds)


def latency_rounds(lat: dict[str, Any], point: str) -> list[tuple[float, float]]:
    """Each round's added `point` ("p50", "p99") over direct: (gateway, minimal proxy), in ms."""
    return [(g[f"{point}_ms"] - d[f"{point}_ms"], m[f"{point}_ms"] - d[f"{point}_ms"])
            for d, m, g in zip(lat["direct"], lat["minimal"], lat["gateway"], strict=True)]


def _latency_row(lat: dict[str, Any], point: str) -> tuple[str, str, str, bool]:
    rounds = latency_rounds(lat, point)
    held = sum(gateway <= minimal for gateway, minimal in rounds)
    needed = _held_needed(len(rounds))
    floor = (f"; byte forwarder, no HTTP: {lat[f'forwarder_added_{point}_ms']:.2f}"
             if f"forwarder_added_{point}_ms" in lat else "")
    return (f"added {point} vs direct at a steady {lat['rate']:g} req/s (open loop)",
            f"≤ the minimal proxy's added {point}, in ≥ {needed} of {len(rounds)} rounds",
            f"held in {held} of {len(rounds)}: gateway "
            + ", ".join(f"{g:.2f}" for g, _ in rounds) + " ms, minimal proxy "
            + ", ".join(f"{m:.2f}" for _, m in rounds)
            + f" (medians {lat[f'added_{point}_ms']:.2f} / {lat[f'minimal_added_{point}_ms']:.2f}"
            + f"{floor})", held >= needed)


def _throughput_row(data: dict[str, Any]) -> tuple[str, str, str, bool | None]:
    label = "non-streaming req/s, 50 clients, all features on, against the aiohttp-only proxy"
    target = "reported (the guard is the Litestar + aiohttp proxy on granian, below)"
    if paired := data.get("paired"):
        ratios = sorted(p["ratio"] for p in paired)
        ratio = float(statistics.median(ratios))
        return (label, target,
                f"{ratio:.2f}x: median of {len(ratios)} rounds, each minimal then gateway "
                f"({', '.join(f'{r:.2f}' for r in ratios)}; gateway "
                f"{statistics.median(p['gateway'] for p in paired):,.0f} req/s, minimal "
                f"{statistics.median(p['minimal'] for p in paired):,.0f})",
                None if "ratio_granian" in paired[0] else ratio >= RATIO)
    return (label, target, "not measured", None)


# The same paired rounds against the gateway's framework and server without the gateway:
# (result key, reference, target ratio or None when reported only).
FRAMEWORK_REFERENCES = (
    ("ratio_granian", "litestar_granian", RATIO, "Litestar + aiohttp on granian"),
    ("ratio_uvicorn", "litestar_uvicorn", None, "Litestar + aiohttp on uvicorn"),
)


def _framework_rows(data: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    paired = [p for p in data.get("paired") or () if "ratio_granian" in p]
    rows: list[tuple[str, str, str, bool | None]] = []
    for key, reference, needed, name in FRAMEWORK_REFERENCES:
        label = f"non-streaming req/s, 50 clients, against {name}"
        target = f"≥ {needed:.2f}x" if needed else "reported"
        if not paired:
            rows.append((label, target, "not measured", None))
            continue
        ratios = sorted(p[key] for p in paired)
        ratio = float(statistics.median(ratios))
        rows.append((label, target,
                     f"{ratio:.2f}x: median of {len(ratios)} rounds "
                     f"({', '.join(f'{r:.2f}' for r in ratios)}; {name} "
                     f"{statistics.median(p[reference] for p in paired):,.0f} req/s)",
                     ratio >= needed if needed else None))
    return rows


def req_ratio(data: dict[str, Any]) -> float | None:
    """The figure `make bench` fails on: the median paired req/s ratio against the minimal
    Litestar + aiohttp proxy on granian (the aiohttp-only proxy's in older results)."""
    if paired := data.get("paired"):
        key = "ratio_granian" if all("ratio_granian" in p for p in paired) else "ratio"
        return float(statistics.median(p[key] for p in paired))
    return None


def _streaming_rows(st: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    what = f"streaming, {st['chunks']}-chunk answers, {st['streams']} concurrent"
    minimal = st["minimal_added_ms"]
    rows: list[tuple[str, str, str, bool | None]] = []
    for name, key, point in (("added TTFT p99", "added_ttft_p99_ms", "ttft"),
                             ("per-chunk added latency p99", "added_chunk_p99_ms", "chunk")):
        rows.append((f"{what}: {name}", "≤ the minimal proxy's",
                     f"{st[key]:.2f} ms, minimal proxy {minimal[f'{point}_p99']:.2f} "
                     f"(p50 {st[key.replace('p99', 'p50')]:.2f} / "
                     f"{minimal[f'{point}_p50']:.2f}; medians of {st['repeats']} repeats)",
                     st[key] <= minimal[f"{point}_p99"]))
    frac = st["gateway_coalesced_fraction"]
    rows.append((f"{what}: coalescing", "reads carrying > 1 chunk ≤ 1%",
                 f"{frac:.2%} of reads (direct {st['direct_coalesced_fraction']:.2%}, minimal "
                 f"proxy {st.get('minimal_coalesced_fraction', 0):.2%}); gap p50 "
                 f"{st['gap_p50_ms']['gateway']:.2f} vs {st['gap_p50_ms']['direct']:.2f} ms",
                 frac <= 0.01))
    return rows


# Each target (label, target, measured text, pass or None when not measured or not a target),
# every one against references measured in the same run, from a result file's data.
def figures(data: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    rows = [_throughput_row(data), *_framework_rows(data)]
    if lat := data.get("latency"):
        rows += [_latency_row(lat, "p50"), _latency_row(lat, "p99")]
    else:
        rows.append(("added p50 / p99 vs direct at a steady 500 req/s (open loop)",
                     "≤ the minimal proxy's, in ≥ 3 of 4 rounds", "not measured", None))
    if st := data.get("streaming"):
        rows += _streaming_rows(st)
    else:
        rows.append(("streaming: added TTFT and per-chunk p99, coalescing",
                     "≤ the minimal proxy's", "not measured", None))
    if cap := data.get("capacity"):
        ok = (cap["completed"] == cap["streams"] and cap["failed"] == 0
              and cap["rss_peak_mib"] < 600)
        judged = cap["streams"] >= 5000  # a quick run holds 1,000: shown, not judged
        rows.append((f"concurrent open streams (1 chunk/{cap['chunk_delay_s']:g} s for "
                     f"{cap['chunks']} s)", "5,000 with gateway RSS < 600 MiB, none dropped",
                     f"{cap['streams']:,} opened, {cap['max_open']:,} open at once, "
                     f"{cap['completed']:,} completed, {cap['failed']:,} dropped; peak RSS "
                     f"{cap['rss_peak_mib']:.0f} MiB" + ("" if judged else " (not 5,000: "
                                                         "not judged)"),
                     ok if judged else None))
    else:
        rows.append(("concurrent open streams (slow upstream)",
                     "5,000 with gateway RSS < 600 MiB, none dropped", "not measured", None))
    if fo := data.get("failover"):
        rows.append(("failover: primary refuses connections (1 client)",
                     "≤ 2 ms added over the secondary alone, same run",
                     f"p50 {fo['added_p50_ms']:.2f} ms, p99 {fo['added_p99_ms']:.2f} ms, "
                     f"{fo['errors']} errors", fo["added_p50_ms"] <= 2 and fo["errors"] == 0))
    else:
        rows.append(("failover: primary refuses connections", "≤ 2 ms added, same run",
                     "not measured", None))
    if ws := data.get("whole_streamed"):
        rows.append((f"whole answers asked upstream as a {ws['chunks']}-event stream and "
                     "assembled (early failover), 10 clients",
                     f"≥ {WHOLE_RATIO:.2f}x relaying them whole",
                     f"{ws['ratio_median']:.2f}x the req/s of relaying them whole "
                     f"({len(ws['rounds'])} paired rounds)", ws["ratio_median"] >= WHOLE_RATIO))
    if asm := data.get("assembly"):
        rows.append((f"a whole chat answer of {asm['events']:,} logprob events, assembled from "
                     "the stream (1 request)", "none: the cost, reported",
                     f"{asm['assembled_s']:.2f} s, {asm['ratio']:.2f}x relaying it as a stream "
                     f"({asm['relayed_s']:.2f} s); /health meanwhile p50 "
                     f"{asm['health_p50_ms']:.1f} ms, max {asm['health_max_ms']:.0f} ms; "
                     + ("complete" if asm["complete"] else "**incomplete**")
                     + f" (medians of {asm['rounds']} rounds)", None))
    if ch := data.get("chaos"):
        rows.append((f"answered under flapping upstreams ({ch['requests']} requests, modes "
                     f"switching every {ch['flip_s']:g} s)", "none: breakers on beside off, "
                     "reported", f"breakers on {ch['on_rate']:.0%}, `circuit.enabled: false` "
                     f"{ch['off_rate']:.0%}", None))
    if tr := data.get("tracing"):
        rows += traced.rows(tr)
    else:
        rows.append(("non-streaming req/s against no tracing code: tracing off / on",
                     "≥ 0.98x / ≥ 0.85x", "not measured", None))
    rows += accounts.rows(data.get("accounts"))
    rows += semantic.rows(data.get("semantic") if "rounds" in data.get("semantic", {}) else None)
    rows += request_log.rows(data.get("request_log"))
    if hd := data.get("hedging"):
        for backup in dict.fromkeys(r["backup"] for r in hd["rows"]):
            mine = [r for r in hd["rows"] if r["backup"] == backup]
            rows.append((f"TTFT p99, a leader slow one time in ten ({hd['fast_s']:g} s, else "
                         f"{hd['slow_s']:g} s), backup {backup}: "
                         + " / ".join(r["config"] for r in mine),
                         "none: side by side, reported",
                         " / ".join(f"{r['p99_ms']:.0f} ms" for r in mine) + "; upstream "
                         "requests per answer " + " / ".join(f"{r['upstream_per_answer']:.2f}"
                                                             for r in mine), None))
    if su := data.get("startup"):
        rows.append(("idle gateway process (no pool)", "RSS < 120 MiB",
                     f"{su['idle_rss_mib']:.0f} MiB", su["idle_rss_mib"] < 120))
        rows.append(("gateway start to ready (no pool)", "none: context (an absolute time)",
                     f"{su['start_to_health_s']:.2f} s", None))
    else:
        rows.append(("idle gateway process (no pool)", "RSS < 120 MiB", "not measured", None))
    return rows


def failed_targets(data: dict[str, Any]) -> list[str]:
    return [label for label, _, _, passed in figures(data) if passed is False]


def targets_table(data: dict[str, Any]) -> str:
    day = datetime.strptime(data["when"], "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%d")
    rows = ["| figure | target | measured | pass | date |", "|---|---|---|---|---|"]
    for label, target, measured, passed in figures(data):
        verdict = "—" if passed is None else ("pass" if passed else "**fail**")
        rows.append(f"| {label} | {target} | {measured} | {verdict} | {day} |")
    return "\n".join(rows)


def stages_table(part: dict[str, Any]) -> str:
    """Each span of a whole answer inside the gateway, from the stages part."""
    dropped = part.get("dropped", part.get("dropped_overlapping", 0))  # the name until 11-24
    rows = [f"{part['requests']:,} requests at {part['rate']:g} req/s after the warm-up "
            f"({dropped} dropped); p50 as the client saw it, probe included: "
            f"{part['gateway_p50_ms']:.2f} ms.", "",
            "| span | p50 µs | p90 µs | p99 µs |", "|---|---|---|---|"]
    rows += [f"| {span['what']} | {span['p50']:.0f} | {span['p90']:.0f} | {span['p99']:.0f} |"
             for span in part["spans_us"].values()]
    return "\n".join(rows)


def replace_between(text: str, name: str, body: str) -> str:
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{DOC} lacks the {start} / {end} markers")
    before, rest = text.split(start, 1)
    return before + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def render(path: Path | None) -> None:
    """Rewrite docs/benchmarks.md's generated tables from one result file."""
    if path is None:
        files = sorted((BENCH / "results").glob("*.json"), reverse=True)
        full = [f for f in files if json.loads(f.read_text()).get("full")]
        if not (full or files):
            raise SystemExit("no result in bench/results/; run the bench first")
        path = (full or files)[0]
    path = path.resolve()
    data = json.loads(path.read_text())
    text = DOC.read_text()
    text = replace_between(text, "targets", targets_table(data))
    if data.get("results"):
        levels = sorted({m["concurrency"] for m in data["results"]})
        text = replace_between(text, "throughput",
                               table([Measurement(**m) for m in data["results"]], levels))
    note = (f"Generated by `bench/run.py render` from `bench/results/{path.name}` "
            f"(load: {data.get('load_generator', '?')}"
            f"{', quick run' if data.get('quick') else ''}).")
    others = [r["core0_others_fraction"] for part in ("latency", "streaming")
              for r in data.get(part, {}).get("gateway", []) if "core0_others_fraction" in r]
    if others:
        note += (f" While the gateway was measured, other processes used {min(others):.0%} to "
                 f"{max(others):.0%} of its core (core 0); load average at the end "
                 f"{data['loadavg_at_end'][0]:.1f}.")
    text = replace_between(text, "source", note)
    if curve := data.get("curve"):
        text = replace_between(text, "curve", plot_curve(curve["points"], data["when"]))
    if part := data.get("stages"):
        text = replace_between(text, "stages", stages_table(part))
    DOC.write_text(text)
    print(f"rendered {DOC.relative_to(ROOT)} from {path.relative_to(ROOT)}")


def plot_curve(points: list[dict[str, Any]], when: str) -> str:
    """Draw latency against offered load into docs/latency-vs-load.png; the markdown that shows
    it (or says why it could not be drawn)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No plot: matplotlib is not installed (`make bench` installs it)."
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    rates = [p["rate"] for p in points]
    styles = {"direct": "tab:gray", "minimal": "tab:blue", "gateway": "tab:red"}
    for name, colour in styles.items():
        for point, line in (("p50_ms", "-"), ("p99_ms", "--")):
            axes.plot(rates, [p[name][point] for p in points], line, color=colour, marker="o",
                      markersize=3, label=f"{name} {point[:3]}")
    axes.set_xlabel("offered load, requests/s (open loop)")
    axes.set_ylabel("latency, ms (log)")
    axes.set_yscale("log")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(ncol=3, fontsize=8)
    day = f"{when[:4]}-{when[4:6]}-{when[6:8]}"
    axes.set_title(f"Non-streaming latency vs offered load, target on one core ({day})",
                   fontsize=10)
    figure.tight_layout()
    figure.savefig(PLOT)
    plt.close(figure)
    rows = ["| offered req/s | direct p50 / p99 ms | minimal p50 / p99 ms | "
            "gateway p50 / p99 ms | gateway achieved req/s |", "|---|---|---|---|---|"]
    rows += [f"| {p['rate']:,.0f} | " + " | ".join(
        f"{p[name]['p50_ms']:.2f} / {p[name]['p99_ms']:.2f}" for name in styles)
        + f" | {p['gateway']['achieved_rps']:,.0f} |" for p in points]
    return f"![latency vs load]({PLOT.name})\n\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=("run", "render"), default="run")
    parser.add_argument("file", nargs="?", type=Path, help="result file for render")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per throughput point (5, or 2 with --quick)")
    parser.add_argument("--levels", default="1,10,50")
    parser.add_argument("--only", action="append", choices=PARTS)
    parser.add_argument("--quick", action="store_true",
                        help="short runs, no repeats, 1,000 streams for capacity")
    parser.add_argument("--no-render", action="store_true")
    args = parser.parse_args()
    if args.command == "render":
        render(args.file)
        return
    raise_nofile()
    levels = [int(x) for x in args.levels.split(",")]
    duration = args.duration or (2.0 if args.quick else 5.0)
    parts = args.only or list(PARTS)
    loaded = {"throughput", "tracing", "accounts", "semantic", "guardrails",
              "request_log"} & set(parts)
    wrk = ensure_wrk() if loaded else None
    if loaded:
        print(f"load generator: {wrk or 'python (bench/loadgen.py)'}")
    data = run_parts(parts, args.quick, levels, duration, wrk)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    full = not args.quick and parts == list(PARTS)
    data = {"when": stamp, "load_generator": "wrk" if wrk else "python", "quick": args.quick,
            "full": full, "parts": parts, "duration_s": duration, "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(), **data}
    out = BENCH / "results" / f"{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print()
    print(targets_table(data))
    print(f"\nraw results: {out.relative_to(ROOT)}")
    if full and not args.no_render:
        render(out)
    if failed := failed_targets(data):
        print("\ntargets failed in this run:\n" + "\n".join(f"- {label}" for label in failed))
    ratio = req_ratio(data)
    if ratio is not None and ratio < RATIO:  # the regression guard: `make bench` fails
        sys.exit(f"req/s at {PAIRED_CLIENTS} clients is {ratio:.2f}x the minimal proxy's, "
                 f"under {RATIO:.2f}x")


if __name__ == "__main__":
    main()
