"""Process and port helpers shared by the benchmark parts (run.py, scenarios.py, stages.py)."""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable


def raise_nofile(wanted: int = 20_000) -> int:
    """Raise this process's open-file limit as far as the hard limit allows; the new soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


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


def http_get_status(port: int, path: str, timeout: float = 1.0) -> int:
    """The status code of one GET on loopback, 0 when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                         .encode())
            head = sock.recv(64)
    except OSError:
        return 0
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def spawn(command: list[str], core: int, log: Path, cwd: Path = ROOT,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process pinned to one core, in its own process group, with a high fd limit
    (in `cwd`, with `env` instead of this process's environment when given)."""
    pinned = ["taskset", "-c", str(core), *command] if shutil.which("taskset") else command
    with log.open("ab") as out:
        return subprocess.Popen(pinned, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=raise_nofile)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def tree(pid: int) -> list[int]:
    """`pid` and every process descended from it: a server may serve from worker processes of
    its own, and what they use is the gateway's too."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], ()))
    return found


def rss_mib(pid: int) -> float:
    """The memory of a process and its descendants, in MiB (0 when they are gone): the sum of
    their PSS (`/proc/<pid>/smaps_rollup`), so pages a server's worker shares with the process
    that started it count once; VmRSS where PSS cannot be read. Of one process alone, PSS is its
    VmRSS less its share of library pages other processes map too (a few MiB)."""
    total = 0
    for member in tree(pid):
        for path, field in ((f"/proc/{member}/smaps_rollup", "Pss:"),
                            (f"/proc/{member}/status", "VmRSS:")):
            try:
                lines = Path(path).read_text().splitlines()
            except OSError:
                continue
            found = [int(line.split()[1]) for line in lines if line.startswith(field)]
            if found:
                total += found[0]
                break
    return total / 1024


def gateway_command(config: Path, port: int) -> list[str]:
    return [PY, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]


def provider(upstream_port: int, **extra: object) -> dict[str, object]:
    """An `openai` provider serving alias bench-model, rewritten to the upstream's id. Whole
    requests are relayed whole, as the minimal proxy relays them (the `whole_streamed` part
    measures what asking upstream for a stream instead costs)."""
    return {"type": "openai", "base_url": f"http://127.0.0.1:{upstream_port}/v1",
            "api_key": "bench-key", "models": {"bench-model": "bench-upstream-model"},
            "stream_upstream": False, **extra}


# A key of `server.api_keys` the accounts parts compare a virtual key with.
STATIC_KEY = "bench-static-key-0123456789abcdef"


def gateway_config(upstream_port: int, path: Path,
                   providers: dict[str, dict[str, object]] | None = None) -> None:
    """Write an llms.json: one provider `fake` at the upstream, or the providers given."""
    path.write_text(json.dumps({
        "server": {"host": "127.0.0.1"},
        "providers": providers or {"fake": provider(upstream_port)},
    }))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process and its descendants have used so far, from /proc (0 for
    those gone)."""
    ticks = 0
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def core_busy_seconds(core: int) -> float:
    """CPU time one core has spent busy (all processes), from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            ticks = [int(x) for x in line.split()[1:]]
            idle = ticks[3] + ticks[4]  # idle + iowait
            return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    return 0.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of unsorted values (every part reports its quantiles alike)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]
