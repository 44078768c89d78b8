"""What tracing costs: req/s and CPU a request at 50 clients, of the same code with no tracing
code path, with tracing off, and with tracing on exporting to a local OTLP receiver (1% of
traces sampled, the target; a tenth and every request, reported).

Every side is this tree's code, in the same run. "Without" is a copy of it with the one line of
tracing a request passes with tracing off cut out (the edge's check for `runtime.tracing`,
`gateway/edge/front.py`): no tracing code path at all. It used to be the main line's commit
before tracing was merged, a base that drifts as the main line moves on and counted every later
feature as tracing's cost. Off, the gateway imports no tracing module
(tests/test_tracing.py checks it), so off against without is the same code but that check:
it reads the noise of the run as much as anything.

The gateways run in turn on core 0, round by round, each round starting with the next one
(drift on a shared machine touches every side alike); the upstream, the receiver and the load
generator share core 1. Beside req/s, each side's CPU time a request (its processes' user +
system time over the round, from /proc) is compared: it moves less when other work takes the
core. Tracing on uses the SDK's batch processor with its defaults (`OTEL_BSP_*`): a queue that
drops spans when full rather than slowing requests.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness import (
    BENCH,
    PY,
    ROOT,
    cpu_seconds,
    free_port,
    gateway_config,
    spawn,
    stop,
    wait_for_port,
)

CLIENTS = 50
# The share of requests traced with tracing on, the target's setting: a gateway busy enough
# for tracing's cost to matter serves thousands of requests a second per worker, and 1% of
# them is still tens of traces a second (OTEL_TRACES_SAMPLER=parentbased_traceidratio); a
# client's sampled `traceparent` is followed whatever the ratio. A sampled request costs the
# SDK several times an untraced one, so a tenth, and every request, are reported beside it.
SAMPLED = 0.01
REPORTED = 0.1
SIDES = ("off", "on", "tenth", "every")
EDGE = Path("gateway/edge/front.py")
# What the edge serves a request within (`Runtime.serving`: its server span when tracing is on,
# nothing when off), cut out: the request answered with no tracing code around it.
_BRANCH = re.compile(r"( +)with runtime\.serving\(.*\):.*\n\1    (await self\._answer\(.*\))\n")


def without_tracing(work: Path) -> Path:
    """This tree's gateway and providers, copied into `work` with what the edge serves a
    request within cut out: what a request runs with no tracing code path."""
    folder = work / "without-tracing"
    for package in ("gateway", "providers"):
        shutil.copytree(ROOT / package, folder / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    edge = folder / EDGE
    text, cut = _BRANCH.subn(r"\1\2\n", edge.read_text())
    if cut != 1 or "tracing" in text.split('"""', 2)[2]:
        raise SystemExit(f"bench/traced.py: {EDGE} no longer serves a request within "
                         "Runtime.serving as _BRANCH cuts it out; update _BRANCH to its shape")
    edge.write_text(text)
    return folder


def tracing_cost(work: Path, duration: float, rounds: int,
                 measure: Callable[[str, int, float], float]) -> dict[str, Any]:
    """`rounds` of the five gateways in turn; `measure(url, clients, seconds)` gives req/s."""
    upstream_port, sink_port = free_port(), free_port()
    config = work / "llms-traced.json"
    gateway_config(upstream_port, config)
    base = without_tracing(work)
    processes = []
    rows: list[dict[str, float]] = []
    try:
        for command, port, log in (
                ([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port)],
                 upstream_port, "upstream-traced.log"),
                ([PY, str(Path(__file__)), str(sink_port)], sink_port, "otlp-sink.log")):
            processes.append(spawn(command, 1, work / log))
            wait_for_port(port, processes[-1])
        urls = {}
        exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                     "OTEL_SERVICE_NAME": "llms-gateway-bench"}
        ratio = {**exporting, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}
        sides: dict[str, tuple[Path, dict[str, str]]] = {
            "without": (base, {}), "off": (ROOT, {}),
            "on": (ROOT, {**ratio, "OTEL_TRACES_SAMPLER_ARG": str(SAMPLED)}),
            "tenth": (ROOT, {**ratio, "OTEL_TRACES_SAMPLER_ARG": str(REPORTED)}),
            "every": (ROOT, exporting)}
        for name, (code, env) in sides.items():
            port = free_port()
            command = [PY, "-m", "gateway", "serve", "--config", str(config), "--port",
                       str(port)]
            clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            processes.append(spawn(command, 0, work / f"gateway-tracing-{name}.log", cwd=code,
                                   env={**clean, "PYTHONPATH": str(code), **env}))
            wait_for_port(port, processes[-1])
            urls[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
        pids = dict(zip(urls, (p.pid for p in processes[2:]), strict=True))
        for turn in range(rounds):
            # Each round in another order: a side first in every round would get the drift.
            order = list(urls)[turn % len(urls):] + list(urls)[:turn % len(urls)]
            row, cpu = {}, {}
            for name in order:
                before = cpu_seconds(pids[name])
                row[name] = measure(urls[name], CLIENTS, duration)
                # `measure` warms up for 1 s first: its requests are counted at the same pace.
                cpu[name] = (cpu_seconds(pids[name]) - before) / (row[name] * (duration + 1))
            rows.append({**row, **{f"{side}_ratio": row[side] / row["without"]
                                   for side in SIDES},
                         **{f"{side}_cpu_us": cpu[side] * 1e6 for side in cpu},
                         **{f"{side}_cpu_ratio": cpu["without"] / cpu[side] for side in SIDES}})
            print(f"  tracing: without {row['without']:,.0f}  off {row['off']:,.0f}  "
                  f"on ({SAMPLED:.0%} sampled) {row['on']:,.0f}  ({REPORTED:.0%}) "
                  f"{row['tenth']:,.0f}  (every request) {row['every']:,.0f} req/s; CPU µs a "
                  f"request {', '.join(f'{n} {cpu[n] * 1e6:,.0f}' for n in urls)}",
                  flush=True)
    finally:
        for process in processes:
            stop(process)
    exported = sum(1 for line in (work / "otlp-sink.log").read_text().splitlines()
                   if line.startswith("export"))
    return {"rounds": rows, "clients": CLIENTS, "without": "this tree, the edge's tracing "
            "branch cut out", "exports": exported,
            **{f"{side}_ratio_median": statistics.median(r[f"{side}_ratio"] for r in rows)
               for side in SIDES},
            **{f"{side}_cpu_ratio_median": statistics.median(r[f"{side}_cpu_ratio"]
                                                             for r in rows) for side in SIDES},
            **{f"{side}_cpu_us_median": statistics.median(r[f"{side}_cpu_us"] for r in rows)
               for side in ("without", *SIDES)},
            "sampled": SAMPLED, "reported": REPORTED}


def sink(port: int) -> None:
    """A local OTLP/HTTP receiver: takes every export, answers 200, keeps nothing."""
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            size = int(self.headers.get("content-length", "0"))
            self.rfile.read(size)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()
            print(f"export {size}", flush=True)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def rows(data: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """The two targets, as `run.figures` lists them."""
    base = f"({data['without_commit']})" if "without_commit" in data else \
        "(the same code, the edge's tracing branch cut out)"  # an older result: another commit
    what = f"non-streaming req/s, {data['clients']} clients, against no tracing code {base}"
    found = []
    sampled = f"{data.get('sampled', 1):.0%}"
    reported = f"{data.get('reported', 0):.0%}"
    for key, needed, side in (
            ("off_ratio", 0.98, "tracing off"),
            ("on_ratio", 0.85, f"tracing on ({sampled} of traces sampled), batch export to a "
                               "local receiver"),
            ("tenth_ratio", None, f"tracing on, {reported} of traces sampled"),
            ("every_ratio", None, "tracing on, every request traced")):
        if not all(key in r for r in data["rounds"]):
            continue
        ratios = sorted(r[key] for r in data["rounds"])
        median = float(statistics.median(ratios))
        measured = f"{median:.2f}x: median of {len(ratios)} rounds " \
                   f"({', '.join(f'{r:.2f}' for r in ratios)})"
        cpu_key = key.replace("_ratio", "_cpu_ratio")
        if all(cpu_key in r for r in data["rounds"]):  # steadier than req/s on a shared core
            cpu = sorted(r[cpu_key] for r in data["rounds"])
            measured += f"; by the gateway's CPU a request {statistics.median(cpu):.2f}x " \
                        f"({', '.join(f'{r:.2f}' for r in cpu)})"
            side_us = key.replace("_ratio", "_cpu_us")
            if f"{side_us}_median" in data:
                measured += f", {data[f'{side_us}_median']:,.0f} µs against " \
                            f"{data['without_cpu_us_median']:,.0f}"
        found.append((f"{what}: {side}", f"≥ {needed:.2f}x" if needed else "reported",
                      measured, median >= needed if needed else None))
    return found


if __name__ == "__main__":
    import sys

    sink(int(sys.argv[1]))
