"""Instructions per request as served: the granian worker under callgrind, over real sockets.

    .venv/bin/python bench/served_callgrind.py [--target gateway|litestar] [--requests 1000]
        [--clients 10] [--warm 300] [--keep DIR] [--logs]

`bench/callgrind.py` counts the gateway's Python in-process; this counts what one served
request costs the worker process: granian, uvloop, aiohttp and the interpreter included (the
kernel's own work is not), its event loop's thread and the others (aiosqlite's writers,
granian's) apart. The upstream (`fake_upstream.py`) and the clients run outside valgrind; the
server runs under `valgrind --tool=callgrind --trace-children=yes` with collection on from the
start, and `callgrind_control -z` zeroes the server's counters (its processes only) after the
warm-up, `-d` dumps them after the measured requests. The worker is the process whose command
line is multiprocessing's `spawn_main`. The disconnect guard's `ARM_AFTER` is raised, as
`bench/callgrind.py` raises it: under valgrind every request would outlast it. Other processes
barely move the figure (the timers' work falls on fewer requests when the machine is busy: a
few %), so it is the one to compare changes with; `--target litestar` counts the minimal
Litestar + aiohttp proxy on granian (the throughput guard's reference) the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
from harness import BENCH, PY, free_port, gateway_command, gateway_config, wait_for_port

BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
START_LIMIT = 300.0  # seconds: a server starting under valgrind runs 30-50 times slower


async def send(url: str, count: int, clients: int) -> int:
    """POST `count` chat requests from `clients` concurrent clients; how many answered 200."""
    remaining = count
    ok = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal remaining, ok
        while remaining > 0:
            remaining -= 1
            async with session.post(url, json=BODY) as answer:
                await answer.read()
                ok += answer.status == 200

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return ok


def wait_answering(url: str, deadline: float) -> None:
    """Wait until the server answers one request (the port opens before the app is ready)."""
    while time.monotonic() < deadline:
        try:
            if asyncio.run(send(url, 1, 1)) == 1:
                return
        except aiohttp.ClientError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not answer within {START_LIMIT:.0f}s")


def control(flag: str, root: int) -> None:
    """`callgrind_control flag` for `root` and its descendants only: with no pid it acts on
    every callgrind run on the machine, another bench's included."""
    subprocess.run(["callgrind_control", flag, *map(str, _family(root))], check=True,
                   capture_output=True)


def _family(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def worker_instructions(folder: Path) -> dict[str, int]:
    """Instructions in the dumps of the worker process (the one multiprocessing spawned), by
    thread: `main` the event loop's, `others` the rest (aiosqlite's writers, granian's)."""
    threads: dict[str, int] = {"main": 0, "others": 0}
    pids = set()
    for path in folder.glob("cg.*"):
        text = path.read_text(errors="replace")
        if "spawn_main" not in text[:4000]:
            continue
        match = re.search(r"^summary: (\d+)", text, re.MULTILINE)
        thread = re.search(r"^thread: (\d+)", text, re.MULTILINE)
        if match:
            pids.add(re.sub(r"-\d+$", "", path.name))
            threads["main" if thread is None or thread.group(1) == "1" else "others"] += \
                int(match.group(1))
    if len(pids) != 1:
        raise RuntimeError(f"expected one worker's dumps in {folder}, found {len(pids)}")
    return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=("gateway", "litestar"), default="gateway")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--logs", action="store_true",
                        help="the request log on (metadata), as the request_log part's 'on'")
    parser.add_argument("--keep", type=Path, help="keep callgrind's files in this folder")
    args = parser.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed")
    work = Path(tempfile.mkdtemp(prefix="llms-served-cg-"))
    out = args.keep or work / "cg"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("cg.*"):
        old.unlink()
    env = {**os.environ, "LLMS_STATE_DIR": str(work / "state")}
    if args.target == "gateway":
        # Under valgrind a request takes 30-50 times as long: past the disconnect guard's
        # `ARM_AFTER`, each would start a watcher that a request at bench speed never does.
        # Raised in every interpreter started (the worker is spawned) through sitecustomize,
        # as bench/callgrind.py raises it in-process.
        site = work / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            "import gateway.edge.disconnect\ngateway.edge.disconnect.ARM_AFTER = 3600.0\n")
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(site), str(BENCH.parent), os.environ.get("PYTHONPATH")]))
    upstream_port, port = free_port(), free_port()
    config = work / "llms.json"
    gateway_config(upstream_port, config)
    if args.logs:
        doc = json.loads(config.read_text())
        config.write_text(json.dumps({**doc, "database": {"url": f"sqlite:///{work}/log.db"},
                                      "logs": {"capture": "metadata"}}))
    if args.target == "gateway":
        server = gateway_command(config, port)
    else:
        server = [PY, str(BENCH / "litestar_proxy.py"), "--port", str(port),
                  "--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--server", "granian"]
    valgrind = ["valgrind", "--tool=callgrind", "--trace-children=yes", "--separate-threads=yes",
                f"--callgrind-out-file={out}/cg.%p"]
    processes = []
    try:
        upstream = subprocess.Popen([PY, str(BENCH / "fake_upstream.py"), "--port",
                                     str(upstream_port)], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
        processes.append(upstream)
        wait_for_port(upstream_port, upstream)
        served = subprocess.Popen(valgrind + server, env=env, cwd=BENCH.parent,
                                  stdout=subprocess.DEVNULL, stderr=(work / "server.log").open("w"),
                                  start_new_session=True)
        processes.append(served)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        wait_for_port(port, served, timeout=START_LIMIT)
        wait_answering(url, time.monotonic() + START_LIMIT)
        asyncio.run(send(url, args.warm, args.clients))
        control("-z", served.pid)
        ok = asyncio.run(send(url, args.requests, args.clients))
        control("-d", served.pid)
        if ok != args.requests:
            raise RuntimeError(f"{args.requests - ok} of {args.requests} requests failed")
        threads = worker_instructions(out)
        print(json.dumps({"target": args.target, "logs": args.logs, "requests": args.requests,
                          "clients": args.clients,
                          "instructions_per_request": round(sum(threads.values()) / args.requests),
                          "event_loop_thread": round(threads["main"] / args.requests),
                          "other_threads": round(threads["others"] / args.requests)}))
    finally:
        for process in reversed(processes):
            try:
                os.killpg(process.pid, 15)
            except ProcessLookupError:
                continue
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
