"""Instructions per request, counted by valgrind's callgrind: a figure no other process moves.

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \
        --callgrind-out-file=/tmp/cg.%p .venv/bin/python bench/callgrind.py [--requests 1000]
        [--out /tmp/cg.%p] [--threads] [--flush N]
        [inprocess.py's options: --stream | --assembled, --chunks N, --key, --logs]

`bench/inprocess.py`'s app, canned upstream and client, with callgrind's instrumentation off
until the 500 warm-up requests are done: it counts only the `--requests` after them (start-up,
imports and the warm-up run at valgrind's uninstrumented speed), then prints instructions per
request from the file callgrind wrote. Switched on and off by callgrind's client requests
(`valgrind/callgrind.h`), built once into a small library with `cc`. Kernel time (a syscall's
own work) is not counted; everything the process executes is, the interpreter included.

By default only the thread serving requests is counted. `--threads` counts every thread (run
valgrind with `--collect-atstart=yes` then: collection is switched per thread, instrumentation
for the process), so the request log's writes in aiosqlite's thread are counted too; `--flush N`
writes the spend rows and the request log's buffer every N measured requests and after the
last, as their tasks would once a second (in-process requests never give the loop's timers a
turn, but the log's writes do: without it, spend rows are written only with the log on).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import inprocess  # run by path, bench/ is on sys.path

from gateway.edge import disconnect

SWITCH = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION;
                      CALLGRIND_TOGGLE_COLLECT; }
void cg_stop(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT("measured");
                     CALLGRIND_STOP_INSTRUMENTATION; }
void cg_start_all(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop_all(void) { CALLGRIND_DUMP_STATS_AT("measured"); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def switch() -> Any:
    """The library whose `cg_start` and `cg_stop` count what runs between them."""
    folder = Path(tempfile.mkdtemp(prefix="llms-callgrind-"))
    (folder / "switch.c").write_text(SWITCH)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(folder / "switch.so"),
                    str(folder / "switch.c")], check=True)
    return ctypes.CDLL(str(folder / "switch.so"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--out", default="/tmp/cg.%p",
                        help="valgrind's --callgrind-out-file, %%p for the pid")
    parser.add_argument("--threads", action="store_true",
                        help="count every thread (valgrind's --collect-atstart=yes)")
    parser.add_argument("--flush", type=int, default=0,
                        help="write spend rows and the request log every N measured requests")
    args, rest = parser.parse_known_args()
    counter = switch()
    start, stop = (counter.cg_start_all, counter.cg_stop_all) if args.threads \
        else (counter.cg_start, counter.cg_stop)
    requests = args.requests

    async def measure(app: Any, body: bytes, transport: Any, _: int, __: bool, key: str
                      ) -> None:
        async with inprocess.lifespan(app):
            secret = inprocess.STATIC_KEY if key == "static" else None
            if key == "virtual":
                secret = await inprocess.virtual_key(app)
            client = inprocess.Client(app, body, key=secret)
            runtime = inprocess.services_of(app)
            runtime.transport = transport
            await runtime.apply(runtime.configured)
            for _ in range(500):
                await client.request()
            journal = inprocess.litestar_of(app).state.journal

            async def flush() -> None:
                await runtime.accounts.flush()  # spend rows: written with the log on or off
                await journal.flush()

            if args.flush:
                await flush()  # the warm-up's rows, before counting
            start()
            for done in range(1, requests + 1):
                await client.request()
                if args.flush and (done % args.flush == 0 or done == requests):
                    await flush()
            stop()
            if client.statuses != {200: 500 + requests}:
                sys.exit(f"not every answer was a 200: {client.statuses}")

    # Under valgrind a request takes long enough for the disconnect guard's watcher to be armed,
    # which it never is at full speed: counts would follow the machine's load. Set before the
    # app is made: its timer that arms guards looks them over every half of it.
    disconnect.ARM_AFTER = 3600.0
    inprocess.measure = measure  # type: ignore[assignment]
    sys.argv = [sys.argv[0], *rest]
    inprocess.main()
    out = next((p for p in _outputs(args.out) if "measured" in p.read_text(errors="replace")),
               None)
    if out is None:
        sys.exit("no callgrind output: run under valgrind --tool=callgrind (see --help)")
    total = next(int(line.split()[1]) for line in out.read_text().splitlines()
                 if line.startswith(("summary:", "totals:")))
    print(f"{total / requests:,.0f} instructions per request ({total:,} over {requests:,}; "
          f"{out})")


def _outputs(pattern: str) -> list[Path]:
    """The files callgrind wrote for this process: `pattern` and its dumps (`.1`, ...)."""
    first = Path(pattern.replace("%p", str(os.getpid())))
    return sorted(p for p in first.parent.glob(first.name + "*") if p.is_file())


if __name__ == "__main__":
    main()
