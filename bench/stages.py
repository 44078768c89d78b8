"""Where the gateway's added latency goes: each stage of a whole answer, timed inside it.

    .venv/bin/python bench/stages.py [--rate 500] [--duration 8] [--repeats 2]

The latency part's setup (fake upstream and load on core 1, the target on core 0), with the
gateway started by `stage_probe/serve.py`: the app `gateway serve` runs, on the same server with
the same options, its `Runtime.trace` hook and aiohttp's client tracing stamping each stage
(`stage_probe/probe.py`). Open-loop load at `--rate` against direct, the byte forwarder and the
gateway in turn, then the quantiles of each span of the gateway's requests and of the added
latency, printed as a table and as JSON. At a low rate the same code takes about twice its time
at 2,000 req/s (caches gone cold between requests): compare `--rate 500` with `--rate 2000`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import BENCH, PY
from scenarios import Started, alternate, start_forwarder
from stage_probe import probe

SPANS = (  # (from stage, to stage, what happens between); those both stamped are shown
    ("request", "admitted", "key, limits, body, parse, route"),
    ("admitted", "provider", "failover loop, disconnect guard, breaker"),
    ("provider", "upstream_sent", "provider builds the request, aiohttp sends it"),
    ("upstream_sent", "upstream_head", "the upstream and two socket hops, aiohttp reads the head"),
    ("upstream_head", "reply", "aiohttp reads the body, the provider checks it"),
    ("provider", "reply", "the provider's call, the upstream included"),
    ("reply", "answered", "the answer handed to the server (ASGI send)"),
    ("answered", "logged", "after the answer: log line, metrics"),
    ("request", "answered", "all of it in the app: the relay route called to answer sent"),
)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {f"p{q}": ordered[int(q / 100 * (len(ordered) - 1))] for q in (10, 50, 90, 99)}


def probed_command(probe_dir: Path) -> Callable[[Path, int], list[str]]:
    """The command line that starts the gateway under the probe, logging to `probe_dir`."""
    return lambda config, port: [PY, str(BENCH / "stage_probe" / "serve.py"), "--config",
                                 str(config), "--port", str(port), "--out", str(probe_dir)]


def _spans(stages: tuple[str, ...], rows: list[dict[str, int]]) -> dict[str, dict[str, Any]]:
    if not rows:
        raise SystemExit("the stage probe recorded no request: see the gateway's log")
    return {f"{start}->{end}": {"what": what, **quantiles(
        [(row[end] - row[start]) / 1000 for row in rows])} for start, end, what in SPANS
        if start in stages and end in stages}


def _openloop(rate: float, duration: float, warmup: float
              ) -> Callable[[str], tuple[object, ...]]:
    """The open-loop load script's command line for a target's URL."""
    return lambda url: ("openloop.py", "--url", url, "--rate", rate, "--duration", duration,
                        "--warmup", warmup)


def gateway_stages(work: Path, rate: float, duration: float) -> dict[str, Any]:
    """`make bench`'s stages part: the gateway alone under the probe at `rate`, open loop; each
    span's quantiles over the requests after the warm-up."""
    folder = work / "stages"
    folder.mkdir(exist_ok=True)
    warmup = 2.0
    with Started(work) as started:
        gateway, process = started.gateway(started.upstream(), name="probed",
                                           command=probed_command(folder))
        run = alternate(1, process.pid, {"gateway": gateway},
                        _openloop(rate, duration, warmup))["gateway"][0]
        time.sleep(0.5)
    stages, rows, dropped = probe.read(folder)
    measured = sorted(rows, key=lambda row: row["request"])[int(warmup * rate):]
    return {"rate": rate, "duration_s": duration, "requests": len(measured),
            "dropped": dropped, "gateway_p50_ms": run["p50_ms"],
            "stages": stages, "spans_us": _spans(stages, measured)}


def measure(rate: float, duration: float, repeats: int) -> dict[str, Any]:
    """Direct, byte forwarder and the probed gateway alternating; the spans of all the
    gateway's requests and each target's added p50."""
    with tempfile.TemporaryDirectory() as tmp:
        work, folder = Path(tmp), Path(tmp) / "stages"
        folder.mkdir()
        with Started(work) as started:
            upstream = started.upstream()
            gateway, process = started.gateway(upstream, name="probed",
                                               command=probed_command(folder))
            forwarder = start_forwarder(started, upstream)
            runs = alternate(repeats, process.pid, {"direct": upstream, "forwarder": forwarder,
                                                    "gateway": gateway},
                             _openloop(rate, duration, 2))
            time.sleep(0.5)
        stages, rows, dropped = probe.read(folder)
    p50 = {name: statistics.median(r["p50_ms"] for r in got) for name, got in runs.items()}
    return {
        "rate": rate, "requests": len(rows), "dropped": dropped,
        "added_p50_ms": {name: p50[name] - p50["direct"] for name in ("forwarder", "gateway")},
        "stages": stages, "spans_us": _spans(stages, rows),
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
          f"({result['dropped']} dropped: not whole answers); added p50: forwarder "
          f"{added['forwarder']:.2f} ms, gateway {added['gateway']:.2f} ms", file=sys.stderr)
    print(f"{'span (µs)':34} {'p10':>6} {'p50':>6} {'p90':>6} {'p99':>7}  what", file=sys.stderr)
    for span, q in result["spans_us"].items():
        print(f"{span:34} {q['p10']:6.1f} {q['p50']:6.1f} {q['p90']:6.1f} {q['p99']:7.1f}  "
              f"{q['what']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
