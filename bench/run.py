"""`make bench`: the gateway against a direct call and a minimal aiohttp proxy, in one run.

The target under test runs pinned to core 0; the fake upstream and the load generator share
core 1. Each target is measured at 1, 10 and 50 concurrent connections with wrk (installed from
Debian if missing) or, failing that, a Python load generator. Results print as a table of
ratios and are saved as JSON under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
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


@dataclass
class Measurement:
    """One target at one concurrency."""

    target: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


def spawn(command: list[str], core: int, log: Path) -> subprocess.Popen[bytes]:
    """Start a process pinned to one core, in its own process group."""
    pinned = ["taskset", "-c", str(core), *command] if shutil.which("taskset") else command
    with log.open("ab") as out:
        return subprocess.Popen(pinned, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


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


def gateway_config(upstream_port: int, path: Path) -> None:
    path.write_text(json.dumps({
        "server": {"host": "127.0.0.1"},
        "providers": {"fake": {
            "type": "openai", "base_url": f"http://127.0.0.1:{upstream_port}/v1",
            "api_key": "bench-key", "models": {"bench-model": "bench-upstream-model"}}},
    }))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--levels", default="1,10,50")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    wrk = ensure_wrk()
    print(f"load generator: {wrk or 'python (bench/loadgen.py)'}")
    work = Path(tempfile.mkdtemp(prefix="llms-bench-"))
    script = work / "post.lua"
    script.write_text(LUA % json.dumps(BODY))
    upstream_port, minimal_port, gateway_port = free_port(), free_port(), free_port()
    config = work / "llms.json"
    gateway_config(upstream_port, config)
    processes = []
    results: list[Measurement] = []
    try:
        upstream = spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port)], 1,
                         work / "upstream.log")
        processes.append(upstream)
        wait_for_port(upstream_port, upstream)
        results += measure("direct", f"http://127.0.0.1:{upstream_port}/v1/chat/completions",
                           levels, args.duration, wrk, script)

        minimal = spawn([PY, str(BENCH / "minimal_proxy.py"), "--port", str(minimal_port),
                         "--upstream", f"http://127.0.0.1:{upstream_port}/v1"], 0,
                        work / "minimal.log")
        processes.append(minimal)
        wait_for_port(minimal_port, minimal)
        results += measure("minimal", f"http://127.0.0.1:{minimal_port}/v1/chat/completions",
                           levels, args.duration, wrk, script)
        stop(minimal)

        gateway = spawn([PY, "-m", "gateway", "serve", "--config", str(config), "--port",
                         str(gateway_port)], 0, work / "gateway.log")
        processes.append(gateway)
        wait_for_port(gateway_port, gateway)
        results += measure("gateway", f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                           levels, args.duration, wrk, script)
    finally:
        for process in processes:
            stop(process)
    print()
    print(table(results, levels))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = BENCH / "results" / f"{stamp}.json"
    out.write_text(json.dumps({"when": stamp, "load_generator": "wrk" if wrk else "python",
                               "duration_s": args.duration,
                               "results": [asdict(m) for m in results]}, indent=1))
    print(f"\nraw results: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
