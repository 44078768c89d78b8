"""Regression guard: the gateway's throughput relative to a minimal aiohttp proxy.

A 2-second closed-loop run at 10 clients of bench/minimal_proxy.py and of the gateway, each
pinned to core 0 with the fake upstream and the load on core 1, through the bench harness's own
functions (bench/run.py `measure`, wrk if installed else bench/loadgen.py). It fails only on a
large relative drop: the ratio gateway/minimal must stay above MIN_RATIO.

Why MIN_RATIO is 0.2: on this shared 2-core machine (a neighbour's process at 100% of a core
during the measurements) the ratio at 10 clients was 0.41-0.44 in `make bench`'s 5 s wrk points
and 0.51-0.59 in five 2 s runs of this test (about 10.5 s each). 0.2 is half the lowest of those,
which leaves room for that noise (a busy neighbour on core 0 slows both targets, but not
always equally over 2 s) and still catches the regressions that matter here: per-request work
doubling, a blocking call on the event loop, a lost keep-alive pool. Smaller drifts are for
`make bench`, which repeats and reports medians.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
MIN_RATIO = 0.2
CLIENTS = 10
SECONDS = 2.0

pytestmark = pytest.mark.skipif(
    shutil.which("taskset") is None or importlib.util.find_spec("aiohttp") is None
    or not (BENCH / "loadgen.py").exists(),
    reason="needs taskset and the bench's load tool (wrk or bench/loadgen.py with aiohttp)")


def test_gateway_keeps_its_throughput_against_a_minimal_proxy() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        import harness
        import run
    finally:
        sys.path.remove(str(BENCH))
    work = Path(tempfile.mkdtemp(prefix="llms-bench-guard-"))
    wrk = shutil.which("wrk")
    script = work / "post.lua"
    script.write_text(run.LUA % run.json.dumps(run.BODY))
    upstream_port, minimal_port, gateway_port = (harness.free_port() for _ in range(3))
    config = work / "llms.json"
    harness.gateway_config(upstream_port, config)
    processes = []
    try:
        for command, core, port, name in (
                ([harness.PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port)], 1,
                 upstream_port, "upstream"),
                ([harness.PY, str(BENCH / "minimal_proxy.py"), "--port", str(minimal_port),
                  "--upstream", f"http://127.0.0.1:{upstream_port}/v1"], 0, minimal_port,
                 "minimal"),
                (harness.gateway_command(config, gateway_port), 0, gateway_port, "gateway")):
            processes.append(harness.spawn(command, core, work / f"{name}.log"))
            harness.wait_for_port(port, processes[-1])
        minimal, = run.measure("minimal", f"http://127.0.0.1:{minimal_port}/v1/chat/completions",
                               [CLIENTS], SECONDS, wrk, script)
        gateway, = run.measure("gateway", f"http://127.0.0.1:{gateway_port}/v1/chat/completions",
                               [CLIENTS], SECONDS, wrk, script)
    finally:
        for process in processes:
            harness.stop(process)
    assert minimal.errors == 0 and gateway.errors == 0
    ratio = gateway.rps / minimal.rps
    assert ratio >= MIN_RATIO, (
        f"gateway {gateway.rps:,.0f} req/s is {ratio:.2f} of the minimal proxy's "
        f"{minimal.rps:,.0f} (guard {MIN_RATIO}); run `make bench` to see where it went")
