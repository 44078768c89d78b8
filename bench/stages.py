"""Where the gateway's added latency goes: each stage of a whole answer, timed inside it.

    .venv/bin/python bench/stages.py [--rate 500] [--duration 8] [--repeats 2]

The latency part's setup (fake upstream and load on core 1, the target on core 0), with the
gateway started under `stage_probe/` (PYTHONPATH): open-loop load at `--rate` against direct,
the byte forwarder and the gateway in turn, then the quantiles of each stage of the gateway's
requests and of the added latency, printed as a table and as JSON. At a low rate the same code
takes about twice its time at 2,000 req/s (caches gone cold between requests): compare
`--rate 500` with `--rate 2000` to see it.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import BENCH
from scenarios import Started, alternate, start_forwarder

PROBE = BENCH / "stage_probe"
_spec = importlib.util.spec_from_file_location("stage_probe", PROBE / "sitecustomize.py")
assert _spec is not None and _spec.loader is not None
_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_probe)  # without STAGE_PROBE_DIR it only defines STAGES
STAGES: tuple[str, ...] = _probe.STAGES

SPANS = (  # (from stage, to stage, what happens between)
    ("received", "relay", "uvicorn parses the request, starts the ASGI task"),
    ("relay", "admitted", "key, limits, body, parse, route"),
    ("admitted", "provider", "failover loop, disconnect guard, breaker"),
    ("provider", "upstream_write", "provider builds the request, wire writes it"),
    ("upstream_write", "upstream_data", "the upstream and two socket hops (not the gateway)"),
    ("upstream_data", "reply", "wire parses the answer, provider checks it"),
    ("reply", "answered", "answer's headers, written to the client"),
    ("answered", "after_done", "after the answer: log line, metrics"),
    ("received", "answered", "all of it, client's bytes in to answer out"),
)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {f"p{q}": ordered[int(q / 100 * (len(ordered) - 1))] for q in (10, 50, 90, 99)}


def read_stamps(folder: Path) -> tuple[list[dict[str, int]], int]:
    """Each request's stamps, and how many lines were dropped as overlapping another."""
    rows, dropped = [], 0
    for log in folder.glob("*.log"):
        for line in log.read_text().splitlines():
            stamps = [int(field) for field in line.split()]
            if any(later < earlier for earlier, later in itertools.pairwise(stamps)):
                dropped += 1
                continue
            rows.append(dict(zip(STAGES, stamps, strict=True)))
    return rows, dropped


def _probed_gateway(started: Started, upstream: int, probe: Path
                    ) -> tuple[int, subprocess.Popen[bytes]]:
    """The gateway on core 0 under the stage probe, logging to `probe`; its port and process."""
    os.environ.update(PYTHONPATH=str(PROBE), STAGE_PROBE_DIR=str(probe))
    try:
        return started.gateway(upstream)
    finally:
        del os.environ["PYTHONPATH"], os.environ["STAGE_PROBE_DIR"]


def _spans(rows: list[dict[str, int]]) -> dict[str, dict[str, Any]]:
    return {f"{start}->{end}": {"what": what, **quantiles(
        [(row[end] - row[start]) / 1000 for row in rows])} for start, end, what in SPANS}


def _openloop(rate: float, duration: float, warmup: float
              ) -> Callable[[str], tuple[object, ...]]:
    """The open-loop load script's command line for a target's URL."""
    return lambda url: ("openloop.py", "--url", url, "--rate", rate, "--duration", duration,
                        "--warmup", warmup)


def gateway_stages(work: Path, rate: float, duration: float) -> dict[str, Any]:
    """`make bench`'s stages part: the gateway alone under the probe at `rate`, open loop; each
    span's quantiles over the requests after the warm-up."""
    probe = work / "stages"
    probe.mkdir(exist_ok=True)
    warmup = 2.0
    with Started(work) as started:
        gateway, process = _probed_gateway(started, started.upstream(), probe)
        run = alternate(1, process.pid, {"gateway": gateway},
                        _openloop(rate, duration, warmup))["gateway"][0]
        time.sleep(0.5)
    rows, dropped = read_stamps(probe)
    measured = sorted(rows, key=lambda row: row["received"])[int(warmup * rate):]
    return {"rate": rate, "duration_s": duration, "requests": len(measured),
            "dropped_overlapping": dropped, "gateway_p50_ms": run["p50_ms"],
            "spans_us": _spans(measured)}


def measure(rate: float, duration: float, repeats: int) -> dict[str, Any]:
    """Direct, byte forwarder and the probed gateway alternating; the spans of all the
    gateway's requests and each target's added p50."""
    with tempfile.TemporaryDirectory() as tmp:
        work, probe = Path(tmp), Path(tmp) / "stages"
        probe.mkdir()
        with Started(work) as started:
            upstream = started.upstream()
            gateway, process = _probed_gateway(started, upstream, probe)
            forwarder = start_forwarder(started, upstream)
            runs = alternate(repeats, process.pid, {"direct": upstream, "forwarder": forwarder,
                                                    "gateway": gateway},
                             _openloop(rate, duration, 2))
            time.sleep(0.5)
        rows, dropped = read_stamps(probe)
    p50 = {name: statistics.median(r["p50_ms"] for r in got) for name, got in runs.items()}
    return {
        "rate": rate, "requests": len(rows), "dropped_overlapping": dropped,
        "added_p50_ms": {name: p50[name] - p50["direct"] for name in ("forwarder", "gateway")},
        "spans_us": _spans(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--duration", type=float, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    result = measure(args.rate, args.duration, args.repeats)
    added = result["added_p50_ms"]
    print(f"{result['rate']:.0f} req/s, {result['requests']} requests "
          f"({result['dropped_overlapping']} overlapping, dropped); added p50: forwarder "
          f"{added['forwarder']:.2f} ms, gateway {added['gateway']:.2f} ms", file=sys.stderr)
    print(f"{'span (µs)':34} {'p10':>6} {'p50':>6} {'p90':>6} {'p99':>7}  what", file=sys.stderr)
    for span, q in result["spans_us"].items():
        print(f"{span:34} {q['p10']:6.1f} {q['p50']:6.1f} {q['p90']:6.1f} {q['p99']:7.1f}  "
              f"{q['what']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
