"""The parts of `make bench` beyond closed-loop throughput.

Each function starts the processes it needs (the target pinned to core 0, upstream and load on
core 1), measures, stops them and returns a JSON-able dict. Points that are cheap are repeated
and the median kept, because this 2-core machine is shared with other work.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import (
    BENCH,
    PY,
    core_busy_seconds,
    cpu_seconds,
    free_port,
    gateway_command,
    gateway_config,
    http_get_status,
    provider,
    rss_mib,
    spawn,
    stop,
    wait_for_port,
)

CHAT = "/v1/chat/completions"


def on_core1(script: str, *args: object, timeout: float = 600) -> dict[str, Any]:
    """Run one of the bench's load scripts on core 1 and parse the JSON it prints."""
    output = subprocess.run(["taskset", "-c", "1", PY, str(BENCH / script),
                             *(str(a) for a in args)],
                            capture_output=True, text=True, check=True, timeout=timeout).stdout
    return dict(json.loads(output))


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


class CpuShare:
    """Over a block: the gateway's share of core 0, and everything else's (other bench targets
    are idle then, so that is mostly other people's work on this shared machine)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.result: dict[str, float] = {}

    def __enter__(self) -> CpuShare:
        self.start = (cpu_seconds(self.pid), core_busy_seconds(0), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        cpu, busy, wall = self.start
        elapsed = time.perf_counter() - wall
        mine = cpu_seconds(self.pid) - cpu
        self.result = {"gateway_cpu_fraction": mine / elapsed,
                       "core0_others_fraction": max(0.0, core_busy_seconds(0) - busy - mine)
                       / elapsed}


class Started:
    """Processes started for one part; all stopped on exit."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Started:
        return self

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            stop(process)

    def upstream(self, *args: object) -> int:
        port = free_port()
        process = spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(port),
                         *(str(a) for a in args)], 1, self.work / "upstream.log")
        self.processes.append(process)
        wait_for_port(port, process)
        return port

    def gateway(self, upstream_port: int, providers: dict[str, dict[str, object]] | None = None,
                name: str = "gateway",
                command: Callable[[Path, int], list[str]] = gateway_command
                ) -> tuple[int, subprocess.Popen[bytes]]:
        """A gateway on core 0 (`command`: its command line from a config file and a port)."""
        port = free_port()
        config = self.work / f"{name}.json"
        gateway_config(upstream_port, config, providers)
        process = spawn(command(config, port), 0, self.work / f"{name}.log")
        self.processes.append(process)
        wait_for_port(port, process)
        return port, process


def _start_on_core0(started: Started, script: str, *args: str) -> int:
    """A reference proxy (a bench script taking --port) on the gateway's core; its port."""
    port = free_port()
    started.processes.append(spawn([PY, str(BENCH / script), "--port", str(port), *args], 0,
                                   started.work / f"{Path(script).stem}.log"))
    wait_for_port(port, started.processes[-1])
    return port


def start_minimal(started: Started, upstream: int) -> int:
    """The minimal proxy on core 0: context for what any Python hop on that core costs."""
    return _start_on_core0(started, "minimal_proxy.py", "--upstream",
                           f"http://127.0.0.1:{upstream}/v1")


def start_forwarder(started: Started, upstream: int) -> int:
    """The byte forwarder on core 0: what any process in the path costs before any HTTP."""
    return _start_on_core0(started, "byte_forwarder.py", "--upstream-port", str(upstream))


def alternate(repeats: int, gateway_pid: int, targets: dict[str, int],
              command: Callable[[str], tuple[object, ...]]) -> dict[str, list[dict[str, Any]]]:
    """Run a load script (on core 1) against each target in turn, `repeats` rounds, so drift on
    the machine touches all alike; each run's JSON gains the gateway's CPU share meanwhile."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for _ in range(repeats):
        for name, port in targets.items():
            with CpuShare(gateway_pid) as share:
                runs[name].append(on_core1(*command(f"http://127.0.0.1:{port}{CHAT}")))
            runs[name][-1].update(share.result)
    return runs


def latency_at_rate(work: Path, rate: float, duration: float, repeats: int) -> dict[str, Any]:
    """Open-loop load at a fixed rate: direct, byte forwarder, minimal proxy, gateway,
    alternating; medians."""
    with Started(work) as started:
        upstream = started.upstream()
        gateway, process = started.gateway(upstream)
        minimal = start_minimal(started, upstream)
        forwarder = start_forwarder(started, upstream)
        runs = alternate(repeats, process.pid, {"direct": upstream, "forwarder": forwarder,
                                                "minimal": minimal, "gateway": gateway},
                         lambda url: ("openloop.py", "--url", url, "--rate", rate,
                                      "--duration", duration, "--warmup", 2))
    out: dict[str, Any] = {"rate": rate, "duration_s": duration, "repeats": repeats, **runs}
    for name, prefix in (("gateway", ""), ("minimal", "minimal_"), ("forwarder", "forwarder_")):
        for p in ("p50", "p99"):
            out[f"{prefix}added_{p}_ms"] = (median_of(runs[name], f"{p}_ms")
                                            - median_of(runs["direct"], f"{p}_ms"))
    # Each round's added latency: the targets compare gateway and minimal proxy round by round.
    for name, key in (("gateway", "added_runs_ms"), ("minimal", "minimal_added_runs_ms")):
        out[key] = [{p: t[f"{p}_ms"] - d[f"{p}_ms"] for p in ("p50", "p99")}
                    for d, t in zip(runs["direct"], runs[name], strict=True)]
    return out


def load_curve(work: Path, rates: list[float], duration: float) -> dict[str, Any]:
    """Latency against offered load: open-loop runs at each rate, direct, minimal proxy and
    gateway in turn, lowest rate first (the curve `docs/latency-vs-load.png` plots)."""
    points: list[dict[str, Any]] = []
    with Started(work) as started:
        upstream = started.upstream()
        gateway, process = started.gateway(upstream)
        minimal = start_minimal(started, upstream)
        for rate in rates:
            runs = alternate(1, process.pid, {"direct": upstream, "minimal": minimal,
                                              "gateway": gateway},
                             lambda url, rate=rate: ("openloop.py", "--url", url, "--rate", rate,
                                                     "--duration", duration, "--warmup", 1))
            points.append({"rate": rate, **{name: r[0] for name, r in runs.items()}})
            print(f"  {rate:6.0f} req/s offered: " + ", ".join(
                f"{name} p50 {r[0]['p50_ms']:.2f} p99 {r[0]['p99_ms']:.2f} ms"
                for name, r in runs.items()), flush=True)
    return {"duration_s": duration, "points": points}


def streaming(work: Path, streams: int, chunks: int, delay: float, duration: float,
              repeats: int) -> dict[str, Any]:
    """Per-chunk timings of `streams` concurrent streams: direct, minimal proxy, gateway.

    The minimal proxy (on core 0 too) is context: what any Python hop on that core costs.
    """
    with Started(work) as started:
        upstream = started.upstream("--chunks", chunks, "--chunk-delay", delay, "--stamp")
        gateway, process = started.gateway(upstream)
        minimal = start_minimal(started, upstream)
        runs = alternate(repeats, process.pid, {"direct": upstream, "minimal": minimal,
                                                "gateway": gateway},
                         lambda url: ("streamclient.py", "--url", url, "--mode", "chunks",
                                      "--streams", streams, "--duration", duration,
                                      "--warmup", 2, "--stagger", chunks * delay))

    def med(name: str, field: str, point: str) -> float:
        return float(statistics.median(r[field][point] for r in runs[name]))

    out: dict[str, Any] = {"streams": streams, "chunks": chunks, "chunk_delay_s": delay,
                           "duration_s": duration, "repeats": repeats, **runs}
    out["added_ttft_p99_ms"] = med("gateway", "ttft_ms", "p99") - med("direct", "ttft_ms", "p99")
    out["added_ttft_p50_ms"] = med("gateway", "ttft_ms", "p50") - med("direct", "ttft_ms", "p50")
    out["added_chunk_p99_ms"] = (med("gateway", "chunk_latency_ms", "p99")
                                 - med("direct", "chunk_latency_ms", "p99"))
    out["added_chunk_p50_ms"] = (med("gateway", "chunk_latency_ms", "p50")
                                 - med("direct", "chunk_latency_ms", "p50"))
    out["minimal_added_ms"] = {
        f"{what}_{point}": med("minimal", field, point) - med("direct", field, point)
        for what, field in (("ttft", "ttft_ms"), ("chunk", "chunk_latency_ms"))
        for point in ("p50", "p99")}
    for name in runs:
        reads = sum(r["reads"] for r in runs[name])
        out[f"{name}_coalesced_fraction"] = (sum(r["coalesced_reads"] for r in runs[name])
                                             / reads if reads else 1.0)
        out[f"{name}_failed"] = sum(r["failed"] for r in runs[name])
    out["gap_p50_ms"] = {name: med(name, "gap_ms", "p50") for name in runs}
    return out


def sample_rss(pid: int, stop_event: threading.Event, samples: list[float]) -> None:
    while not stop_event.wait(0.25):
        samples.append(rss_mib(pid))


def capacity(work: Path, streams: int, chunks: int, delay: float, ramp: float) -> dict[str, Any]:
    """Hold `streams` slow streams open through the gateway; its peak RSS and how many ended."""
    with Started(work) as started:
        upstream = started.upstream("--chunks", chunks, "--chunk-delay", delay)
        gateway, process = started.gateway(upstream)
        idle = rss_mib(process.pid)
        samples: list[float] = []
        done = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=(process.pid, done, samples))
        sampler.start()
        try:
            result = on_core1("streamclient.py", "--url", f"http://127.0.0.1:{gateway}{CHAT}",
                              "--mode", "hold", "--streams", streams, "--ramp", ramp)
        finally:
            done.set()
            sampler.join()
        alive = process.poll() is None
    return {**result, "chunks": chunks, "chunk_delay_s": delay, "ramp_s": ramp,
            "rss_before_mib": idle, "rss_peak_mib": max(samples, default=0.0),
            "gateway_alive_after": alive}


def failover(work: Path, duration: float, repeats: int) -> dict[str, Any]:
    """1 client: primary refuses connections then secondary, vs the secondary alone."""
    closed = free_port()  # nothing listens here
    with Started(work) as started:
        upstream = started.upstream()
        # The breaker is off on the dead primary so every request pays the refused connect;
        # with it on, the primary is skipped after 5 failures and failover costs nothing.
        two, _ = started.gateway(upstream, {
            "down": provider(closed, circuit={"enabled": False}),
            "fake": provider(upstream)}, name="failover")
        one, _ = started.gateway(upstream, None, name="single")
        runs: dict[str, list[dict[str, Any]]] = {"failover": [], "single": []}
        for _ in range(repeats):
            for name, port in (("single", one), ("failover", two)):
                url = f"http://127.0.0.1:{port}{CHAT}"
                on_core1("loadgen.py", "--url", url, "--concurrency", 1, "--duration", 1)
                runs[name].append(on_core1("loadgen.py", "--url", url, "--concurrency", 1,
                                           "--duration", duration))
    out: dict[str, Any] = {"duration_s": duration, "repeats": repeats, **runs}
    for p in ("p50", "p99"):
        out[f"added_{p}_ms"] = (median_of(runs["failover"], f"{p}_ms")
                                - median_of(runs["single"], f"{p}_ms"))
    out["errors"] = sum(r["errors"] for r in runs["failover"])
    # The gateway logs each request's failed attempts: proof the primary was tried each time.
    log = (work / "failover.log").read_text(errors="replace")
    out["requests_logged"] = log.count('"event":"request"')
    out["requests_failed_over"] = log.count('"failed":["down:')
    return out


def startup(work: Path, repeats: int, idle_wait: float = 2.0) -> dict[str, Any]:
    """Spawn to first /health 200, and VmRSS after idling, of a gateway with no pool."""
    runs = []
    for i in range(repeats):
        with Started(work) as started:
            port = free_port()
            config = work / "startup.json"
            gateway_config(free_port(), config)  # an openai provider; nothing is called
            began = time.perf_counter()
            process = spawn(gateway_command(config, port), 0, work / "startup.log")
            started.processes.append(process)
            ready = wait_until(port, process, 20)
            seconds = time.perf_counter() - began if ready else float("inf")
            time.sleep(idle_wait)
            runs.append({"run": i, "start_to_health_s": seconds,
                         "idle_rss_mib": rss_mib(process.pid)})
    return {"repeats": repeats, "idle_wait_s": idle_wait, "runs": runs,
            "start_to_health_s": median_of(runs, "start_to_health_s"),
            "idle_rss_mib": median_of(runs, "idle_rss_mib")}


def wait_until(port: int, process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll /health every 5 ms until it answers 200."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            return False
        if http_get_status(port, "/health") == 200:
            return True
        time.sleep(0.005)
    return False
