"""Log every garbage collection of every Python process started with this folder on PYTHONPATH.

    PYTHONPATH=bench/gc_probe GC_PROBE_DIR=/tmp/gc .venv/bin/python bench/run.py --only capacity

Each process appends to GC_PROBE_DIR/<pid>.log its command line, then one line per collection:
monotonic time, generation, pause in ms, objects collected. A file per process, written as it
goes: a server stopped by SIGTERM may never run exit hooks. `gateway serve` serves from a worker
process granian spawns: the gateway's file is that worker's, whose command line is
multiprocessing's `spawn_main` (the one saying `serve` is the supervisor's, nearly idle). With no
GC_PROBE_DIR it does nothing. How the gateway's collector thresholds were chosen
(gateway/app.py).
"""

import gc
import os
import sys
import time

_dir = os.environ.get("GC_PROBE_DIR")
if _dir:
    _started = [0.0]
    _log = open(os.path.join(_dir, f"{os.getpid()}.log"), "a", buffering=1)  # noqa: SIM115
    _log.write("CMD " + " ".join(sys.argv) + "\n")

    def _on_collection(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - _started[0]) * 1000
        _log.write(f"{time.monotonic():.3f} gen{info['generation']} {pause_ms:.3f}ms "
                   f"collected={info['collected']}\n")

    gc.callbacks.append(_on_collection)
