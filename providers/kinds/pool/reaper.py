"""Run one worker so that it never outlives the gateway: `python reaper.py GRACE -- ARGV...`.

Started as the leader of a new process group, it asks the kernel for SIGTERM when its parent
(the gateway) dies, even by SIGKILL (`PR_SET_PDEATHSIG`), then runs the worker in its group. On
SIGTERM/SIGINT it passes the signal to the worker, waits up to GRACE seconds, then SIGKILLs the
whole group, engine subprocesses included. Run by path, not as a module, so it starts in tens of
milliseconds and imports nothing of the gateway.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the gateway's own shutdown still stops the group
    if os.getppid() != parent:  # the gateway died before prctl took effect
        sys.exit(1)


def main(argv: list[str]) -> int:
    grace = float(argv[0])
    command = argv[argv.index("--") + 1:]
    _die_with_parent(int(os.environ.pop("LLMS_REAPER_PARENT", os.getppid())))
    worker = subprocess.Popen(command)
    stopping_since: list[float] = []

    def stop(signum: int, _frame: object) -> None:
        if not stopping_since:
            stopping_since.append(time.monotonic())
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        try:
            code = worker.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if stopping_since and time.monotonic() - stopping_since[0] > grace:
                os.killpg(0, signal.SIGKILL)  # the worker, its children, and this process
    # The worker is gone; its own children (engine processes) must not linger either.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGTERM)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
