"""The request_log part: req/s with the request log on (metadata, a row per request written to
SQLite in batches) against the same gateway without a `logs` section, in paired rounds.

Two gateways on core 0, each with its own SQLite database, the upstream and the load generator
on core 1; the two alternate round by round, each round starting with the other one, so drift
on a shared machine touches both alike. Each side's CPU time a request is measured too (its
process's, over the round): on a machine others share, req/s moves with their load, CPU time
much less (the journal's writes land in the round after, alike on every round). At the end,
the logged gateway's rows are counted through `/admin/logs`' export, so a run whose rows were
not written is not a pass.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import BENCH, PY, ROOT, cpu_seconds, free_port, provider, spawn, stop, wait_for_port

CLIENTS = 50
TARGET = 0.95


def _config(path: Path, upstream_port: int, database: str, logs: bool) -> None:
    path.write_text(json.dumps({
        "server": {"host": "127.0.0.1"}, "database": {"url": database},
        "providers": {"fake": provider(upstream_port)},
        **({"logs": {"capture": "metadata"}} if logs else {}),
    }))


def _rows(port: int) -> int:
    """The rows the gateway's request log holds (its export, line by line)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/logs?format=ndjson",
                                timeout=60) as answer:
        return sum(1 for line in answer if line.strip())


def request_log_cost(work: Path, duration: float, rounds: int,
                     measure: Callable[[str, float], float]) -> dict[str, Any]:
    """`rounds` of the two gateways in turn; `measure(url, seconds)`: req/s at `CLIENTS`."""
    upstream_port = free_port()
    processes = [spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port)], 1,
                       work / "upstream-request-log.log")]
    try:
        wait_for_port(upstream_port, processes[0])
        ports, pids = {}, {}
        for side in ("off", "on"):
            port, config = free_port(), work / f"llms-request-log-{side}.json"
            _config(config, upstream_port, f"sqlite:///{tempfile.mkdtemp(dir=work)}/bench.db",
                    side == "on")
            processes.append(spawn([PY, "-m", "gateway", "serve", "--config", str(config),
                                    "--port", str(port)], 0,
                                   work / f"gateway-request-log-{side}.log", cwd=ROOT))
            wait_for_port(port, processes[-1])
            ports[side], pids[side] = port, processes[-1].pid
        rows = []
        for turn in range(rounds):
            order = ["off", "on"] if turn % 2 == 0 else ["on", "off"]
            row, cpu = {}, {}
            for side in order:
                before = cpu_seconds(pids[side])
                row[side] = measure(f"http://127.0.0.1:{ports[side]}/v1/chat/completions",
                                    duration)
                # `measure` warms up for 1 s first: its requests are counted at the same pace.
                cpu[side] = (cpu_seconds(pids[side]) - before) / (row[side] * (duration + 1))
            rows.append({**row, "ratio": row["on"] / row["off"], "off_cpu_us": cpu["off"] * 1e6,
                         "on_cpu_us": cpu["on"] * 1e6, "cpu_ratio": cpu["off"] / cpu["on"]})
            print(f"  request log: off {row['off']:,.0f}  on (metadata) {row['on']:,.0f} "
                  f"req/s; CPU µs a request off {cpu['off'] * 1e6:,.0f}, on "
                  f"{cpu['on'] * 1e6:,.0f}", flush=True)
        logged = _rows(ports["on"])
    finally:
        for process in processes:
            stop(process)
    return {"clients": CLIENTS, "rounds": rows, "rows_logged": logged,
            "ratio_median": statistics.median(r["ratio"] for r in rows),
            "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in rows)}


def rows(data: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """The target, as `run.figures` lists them."""
    label = "non-streaming req/s: the request log on (metadata) against off"
    if data is None:
        return [(label, f"≥ {TARGET:.2f}x", "not measured", None)]
    ratios = sorted(r["ratio"] for r in data["rounds"])
    median = float(statistics.median(ratios))
    return [(f"{label}, {data['clients']} clients", f"≥ {TARGET:.2f}x",
             f"{median:.2f}x: median of {len(ratios)} rounds "
             f"({', '.join(f'{r:.2f}' for r in ratios)}); by CPU a request "
             f"{data['cpu_ratio_median']:.2f}x; {data['rows_logged']:,} rows logged",
             median >= TARGET and data["rows_logged"] > 0)]
