"""Profile the gateway's hot path: py-spy on the gateway while wrk drives 50 clients.

    .venv/bin/python bench/pyspy_profile.py [--seconds 8] [--clients 50] [--stream] [--top 30]

The gateway runs pinned to core 0 as in `make bench`, the fake upstream and the load on core 1.
py-spy samples at 400 Hz; the report lists self time by module and by function (a line per
`file:line`). `--stream` profiles 100 concurrent 200-chunk streams instead of wrk's
non-streaming load. py-spy comes with `make bench` (the bench extra).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import (
    BENCH,
    PY,
    free_port,
    gateway_command,
    gateway_config,
    spawn,
    stop,
    wait_for_port,
)
from run import BODY, LUA, ensure_wrk

# A sample of a process with no Python frame: a thread in native code only (granian's Rust
# threads, C between callbacks). A Python leaf that awaits the server (an ASGI `send` or
# `receive`) also holds the server's native work done in that call.
NATIVE = "(no Python frame: native code)"
_PROCESS = re.compile(r'process \d+:"[^"]*";?')


def report(raw: Path, top: int) -> str:
    """Self time by module and by function from py-spy's raw (collapsed stacks) output."""
    by_module: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        # --subprocesses puts the process (its command line) first in each stack.
        frames = _PROCESS.sub("", stack)
        leaf = re.sub(r"\(/\S*?site-packages/", "(", frames.split(";")[-1]) if frames \
            else NATIVE
        by_function[leaf] += int(count)
        path = re.search(r"\((.*?):\d+\)", leaf)
        by_module[path.group(1) if path else leaf] += int(count)
    lines = [f"{total} samples", "", "self time by module:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in by_module.most_common(top)]
    lines += ["", "self time by function (file:line):"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in by_function.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--clients", type=int, default=50, help="wrk's connections")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--tracing", type=float, default=None, metavar="RATIO",
                        help="tracing on, this share of traces sampled, exported to a local "
                             "OTLP receiver (bench/traced.py's)")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=str(Path(PY).parent)) or shutil.which("py-spy")
    wrk = ensure_wrk()
    if py_spy is None or (wrk is None and not args.stream):
        sys.exit("needs py-spy (make bench installs it) and wrk")
    work = Path(tempfile.mkdtemp(prefix="llms-profile-"))
    upstream_port, gateway_port = free_port(), free_port()
    extra = ["--chunks", "200", "--chunk-delay", "0.01", "--stamp"] if args.stream else []
    processes = [spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port),
                        *extra], 1, work / "upstream.log")]
    try:
        wait_for_port(upstream_port, processes[0])
        gateway_config(upstream_port, work / "llms.json")
        env = None
        if args.tracing is not None:
            sink_port = free_port()
            processes.append(spawn([PY, str(BENCH / "traced.py"), str(sink_port)], 1,
                                   work / "otlp-sink.log"))
            wait_for_port(sink_port, processes[-1])
            env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
                   "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                   "OTEL_TRACES_SAMPLER_ARG": str(args.tracing)}
        gateway = spawn(gateway_command(work / "llms.json", gateway_port), 0,
                        work / "gateway.log", env=env)
        processes.append(gateway)
        wait_for_port(gateway_port, gateway)
        url = f"http://127.0.0.1:{gateway_port}/v1/chat/completions"
        load_seconds = args.seconds + 4
        if args.stream:
            load = [PY, str(BENCH / "streamclient.py"), "--url", url, "--streams", "100",
                    "--duration", str(load_seconds), "--warmup", "1", "--stagger", "2"]
        else:
            script = work / "post.lua"
            script.write_text(LUA % json.dumps(BODY))
            load = [str(wrk), "-t1", f"-c{args.clients}", f"-d{load_seconds:g}s", "-s",
                    str(script), url]
        with (work / "load.out").open("w") as out:
            driver = subprocess.Popen(["taskset", "-c", "1", *load], stdout=out, cwd=BENCH)
            raw = work / "profile.txt"
            # --subprocesses: the server may serve from worker processes of its own.
            subprocess.run([py_spy, "record", "-p", str(gateway.pid), "--subprocesses",
                            "-d", f"{args.seconds:g}", "-r", "400", "-f", "raw", "-o", str(raw),
                            "--nonblocking"],
                           capture_output=True, check=True)
            driver.wait()
        print(report(raw, args.top))
        print(f"\nraw stacks: {raw} (flamegraph: py-spy's -f flamegraph, or inferno)")
    finally:
        for process in processes:
            stop(process)


if __name__ == "__main__":
    main()
