"""How `gateway serve` runs the app: granian, with the limits of `server` in llms.json.

granian was chosen by measurement (docs/benchmarks.md, "Choosing the ASGI server"): of the
servers tried it alone closes a connection whose request head has not arrived in time however
slowly the client dribbles it, and it refuses an oversized head from a bounded buffer. What it
leaves to the app (the JSON envelope on a 431, the body deadline) is `gateway.edge.guard`'s.

Only granian's public API is used: `Granian(...)`, its `on_startup` hook and `HTTP1Settings`.

`gateway serve` checks the config, then `launch`es: it becomes (exec) `python -m
gateway.edge.serving` with the few numbers the server needs, so the server process holds granian
and little else rather than everything the check imported (tens of MiB, for the life of the
server, in a process that serves no request).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import math
import multiprocessing
import os
import signal
import sys
from typing import Any, NamedTuple, NoReturn, Protocol

APP = "gateway.app:create_app"
# After `server.drain_timeout` the gateway ends the streams still open itself (in-band error,
# `gateway.state.drain`); the server kills a worker still running this much later.
KILL_MARGIN = 5
# hyper's smallest read buffer.
MIN_BUFFER = 8192
PR_SET_PDEATHSIG = 1
# A worker's connection cap when the open-file limit is unlimited: tokio's semaphore takes no
# more than about 2**61 permits, and no process holds more connections than this anyway.
MAX_CONNECTIONS = 1 << 20


class ServerLimits(Protocol):
    """What the server reads of llms.json's `server` (a `ServerConfig`, or `Limits`)."""

    @property
    def header_timeout(self) -> float: ...
    @property
    def keepalive_timeout(self) -> float: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def drain_timeout(self) -> float: ...


class Limits(NamedTuple):
    """`ServerLimits` as `launch` hands them to the process it becomes."""

    header_timeout: float
    keepalive_timeout: float
    max_header_bytes: int
    drain_timeout: float


def head_timeout(server: ServerLimits) -> float:
    """Seconds a connection may wait without a whole request head before it is closed: granian
    (hyper) has one timer for a new connection, a head arriving, and an idle kept-alive
    connection waiting for its next request, so it is the shorter of the two settings."""
    return min(server.header_timeout, server.keepalive_timeout)


def buffer_size(server: ServerLimits) -> int:
    """granian's per-connection read buffer: the most of a request head it holds. Twice the
    limit, so that a head somewhat over it reaches `gateway.edge.guard` and gets the 431 in the JSON
    envelope; one larger is cut by granian itself (a 431 with no body) once the buffer is full,
    so memory per connection stays bounded whatever a client sends."""
    return max(MIN_BUFFER, 2 * server.max_header_bytes)


def launch(server: ServerLimits, host: str, port: int, workers: int, open_files: int
           ) -> NoReturn:
    """`run`, in this process made anew by exec (the same pid, environment and limits)."""
    limits = Limits(server.header_timeout, server.keepalive_timeout, server.max_header_bytes,
                    server.drain_timeout)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", __name__, host, str(port), str(workers),
                              str(open_files), *(str(value) for value in limits)])


def run(server: ServerLimits, host: str, port: int, workers: int, open_files: int,
        app: str = APP) -> None:
    """Serve the app factory `app` names on `host:port` until SIGTERM or SIGINT (open requests
    get `server.drain_timeout` seconds to finish); `open_files` is the process's descriptor limit.
    Profilers pass their own factory around the gateway's (bench/stage_probe/serve.py)."""
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    # Each worker a fresh interpreter, as uvicorn's were: a forked one would inherit what this
    # process imported, prometheus_client's one-process metrics among them (set at its import,
    # before PROMETHEUS_MULTIPROC_DIR is).
    multiprocessing.set_start_method("spawn", force=True)
    granian_server = Granian(
        app, factory=True, address=host, port=port, workers=workers,
        # `asgi`, not `asginl`: the app's lifespan owns its sessions and background tasks.
        interface=Interfaces.ASGI, loop=Loops.uvloop,
        # HTTP/1.1 only: every OpenAI client speaks it, and HTTP/2's header limits are other
        # settings with far larger defaults. WebSockets for the Realtime API (`/v1/realtime`).
        http=HTTPModes.http1, websockets=True,
        http1_settings=HTTP1Settings(header_read_timeout=max(1, int(head_timeout(server) * 1000)),
                                     keep_alive=True, max_buffer_size=buffer_size(server)),
        # granian's own cap on a worker's connections (1,024 by default) would leave streams
        # past it waiting unanswered in the backlog; the descriptors are the real cap, and past
        # max_concurrency the app answers 503 itself.
        backpressure=min(max(1, open_files), MAX_CONNECTIONS), backlog=2048,
        log_level=LogLevels.warning, log_access=False,
        # A worker that dies is replaced; one that dies again at once stops the server.
        respawn_failed_workers=True,
        workers_kill_timeout=math.ceil(server.drain_timeout) + KILL_MARGIN,
    )
    # The hook runs in this process after granian has set its own signal handlers.
    granian_server.on_startup(forward_sighup)
    granian_server.serve(target_loader=functools.partial(load_in_worker, os.getpid()))


def forward_sighup() -> None:
    """Make SIGHUP to the server process reload every worker's config in place. granian's own
    SIGHUP respawns the workers: streams longer than the drain were cut, and what the old
    workers knew (admin switches, circuits, stored responses) was lost."""
    def forward(signum: int, frame: object) -> None:
        for worker in multiprocessing.active_children():
            if worker.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGHUP)

    signal.signal(signal.SIGHUP, forward)


def load_in_worker(server_pid: int, target: str) -> Any:
    """The app for one granian worker, built in that worker by the factory `target` names. The
    worker is first tied to the server process: were that killed (even by SIGKILL, which runs
    no shutdown code), the worker would go on serving the socket and keep its pool's engines."""
    _die_with(server_pid)
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)()


def _die_with(parent: int) -> None:
    """Ask the kernel for SIGTERM (a graceful stop: lifespan shutdown, pool drained) when the
    parent process dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the server's own shutdown still stops its workers
    if os.getppid() != parent:  # it died before prctl took effect
        sys.exit(1)


def main(argv: list[str]) -> None:
    """What `launch` execs: `run` with its arguments from the command line."""
    host, port, workers, open_files, header, keepalive, max_header, drain = argv
    run(Limits(float(header), float(keepalive), int(max_header), float(drain)), host, int(port),
        int(workers), int(open_files))


if __name__ == "__main__":
    main(sys.argv[1:])
