"""What tracing costs: req/s at 50 clients of the gateway without any tracing code (the commit
before it came), with tracing off, and with tracing on exporting to a local OTLP receiver
(1% of traces sampled, the target; a tenth and every request, reported).

The gateways run in turn on core 0, round by round, each round starting with the next one
(drift on a shared machine touches every side alike); the upstream, the receiver and the load
generator share core 1.
The code without tracing is the main line's commit before `gateway/observe/tracing.py` came
(before the merge that brought it), unpacked from git into the run's work folder. Tracing on
uses the SDK's batch processor with its defaults (`OTEL_BSP_*`): a queue that drops spans when
full rather than slowing requests.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tarfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path
from typing import Any

from harness import BENCH, PY, ROOT, free_port, gateway_config, spawn, stop, wait_for_port

CLIENTS = 50
# The share of requests traced with tracing on, the target's setting: a gateway busy enough
# for tracing's cost to matter serves thousands of requests a second per worker, and 1% of
# them is still tens of traces a second (OTEL_TRACES_SAMPLER=parentbased_traceidratio); a
# client's sampled `traceparent` is followed whatever the ratio. A sampled request costs the
# SDK about twice an untraced one, so a tenth, and every request, are reported beside it.
SAMPLED = 0.01
REPORTED = 0.1
SIDES = ("off", "on", "tenth", "every")
TRACING_MODULE = "gateway/observe/tracing.py"


def without_tracing(work: Path) -> tuple[str, Path]:
    """The commit before tracing came, unpacked (gateway and providers) into `work`: on the
    main line (`--first-parent`), the one before tracing was merged, with every other feature
    merged until then; not the tracing branch's own base, older by whatever main merged
    meanwhile, which would count that work as tracing's."""
    added = subprocess.run(["git", "log", "--first-parent", "--diff-filter=A", "--format=%H",
                            "--", TRACING_MODULE], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    ref = f"{added[-1]}^" if added else "HEAD"
    archive = subprocess.run(["git", "archive", "--format=tar", ref, "gateway", "providers"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    folder = work / "without-tracing"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    return commit, folder


def tracing_cost(work: Path, duration: float, rounds: int,
                 measure: Callable[[str, int, float], float]) -> dict[str, Any]:
    """`rounds` of the three gateways in turn; `measure(url, clients, seconds)` gives req/s."""
    upstream_port, sink_port = free_port(), free_port()
    config = work / "llms-traced.json"
    gateway_config(upstream_port, config)
    commit, base = without_tracing(work)
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
    return {"rounds": rows, "clients": CLIENTS, "without_commit": commit, "exports": exported,
            "off_ratio_median": statistics.median(r["off_ratio"] for r in rows),
            "on_ratio_median": statistics.median(r["on_ratio"] for r in rows),
            "tenth_ratio_median": statistics.median(r["tenth_ratio"] for r in rows),
            "every_ratio_median": statistics.median(r["every_ratio"] for r in rows),
            **{f"{side}_cpu_ratio_median": statistics.median(r[f"{side}_cpu_ratio"]
                                                             for r in rows) for side in SIDES},
            "sampled": SAMPLED, "reported": REPORTED}


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process and its children (granian's worker), so far."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
        spent[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grown = {pid}, True
    while grown:
        found = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= found
        grown = bool(found)
    return sum(spent.get(p, 0.0) for p in tree)


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
    what = f"non-streaming req/s, {data['clients']} clients, against no tracing code " \
           f"({data['without_commit']})"
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
        found.append((f"{what}: {side}", f"≥ {needed:.2f}x" if needed else "reported",
                      measured, median >= needed if needed else None))
    return found


if __name__ == "__main__":
    import sys

    sink(int(sys.argv[1]))
