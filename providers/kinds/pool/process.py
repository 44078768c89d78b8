"""A spawned worker process: started under the reaper in its own process group, its output kept
in a log file of its own, stopped with SIGTERM then SIGKILL.

The gateway's log gets one line per worker event (starting, ready, failed with its last words:
`gateway.pool`), not the worker's chatter: a llama.cpp server prints a traceback per request it
refuses, which drowned the request lines. The whole output is in `log_dir()/<worker>.log`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from providers.contract.log import get_logger

REAPER = Path(__file__).with_name("reaper.py")
KEPT_LINES = 30  # the tail quoted when a worker dies
MAX_LOG_BYTES = 16 * 1024 * 1024  # a worker's log file starts over past this


def state_dir() -> Path:
    """The gateway's own state folder (`$LLMS_STATE_DIR`, which `llms-gateway serve` sets for
    the processes it starts), else the user's."""
    if explicit := os.environ.get("LLMS_STATE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "llms-gateway"


def log_dir() -> Path:
    """Where workers' output goes: `workers/` in the gateway's state folder."""
    return state_dir() / "workers"


def port_taken(host: str, port: int) -> str | None:
    """Why a worker cannot listen on `host:port` (another program, another gateway's worker
    among them, holds it), or None. Checked before each spawn: the new worker would fail to bind
    while the other answered its health checks in its stead."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our own TIME_WAITs
        try:
            probe.bind((host, port))
        except OSError as exc:
            return (f"port {port} on {host} is in use by another program (another gateway's "
                    f"pool?): {exc.strerror}; give this pool another `port`")
    return None


_PROBES = ('"GET /health ', '"GET /metrics ', '"GET /v1/models ', '"GET /docs ')


def is_probe_noise(line: str) -> bool:
    """An access-log line for the pool's own once-a-second checks: not worth a log line."""
    return any(probe in line for probe in _PROBES) and " 200" in line


class WorkerProcess:
    """One running worker command and the task that forwards its output."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.tail: deque[str] = deque(maxlen=KEPT_LINES)
        self.log_path = log_dir() / f"{name}.log"
        self._forwarding = asyncio.create_task(self._forward())

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def spawn(cls, name: str, argv: Sequence[str], env: Mapping[str, str],
                    grace: float) -> WorkerProcess:
        """Start `argv` under the reaper, with `env` added to the gateway's environment."""
        full_env = {**os.environ, **env, "LLMS_REAPER_PARENT": str(os.getpid()),
                    "PYTHONUNBUFFERED": "1"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(REAPER), f"{grace:g}", "--", *argv, env=full_env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        return cls(name, process)

    async def _forward(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        kept = self._open_log()
        try:
            while line := await stream.readline():
                text = line.decode("utf-8", "replace").rstrip()
                if text and not is_probe_noise(text):
                    self.tail.append(text)
                    if kept is not None:
                        kept = self._write(kept, line)
        finally:
            if kept is not None:
                kept.close()

    def _open_log(self) -> BinaryIO | None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            return self.log_path.open("ab")
        except OSError as exc:  # the tail is still quoted when the worker dies
            get_logger().warning("worker_log_unwritable", worker=self.name, error=str(exc))
            return None

    def _write(self, kept: BinaryIO, line: bytes) -> BinaryIO | None:
        try:
            if kept.tell() > MAX_LOG_BYTES:
                kept.seek(0)
                kept.truncate()
            kept.write(line)
            kept.flush()
            return kept
        except OSError:
            kept.close()
            return None

    def last_words(self) -> str:
        """The worker's last output lines, for the log line saying why it died."""
        return " | ".join(list(self.tail)[-5:])

    async def wait(self) -> int:
        """Wait for exit (and the last of its output); its exit code."""
        code = await self.process.wait()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._forwarding), 2)
        return code

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    async def stop(self, grace: float) -> None:
        """SIGTERM (the reaper passes it on), up to `grace` s to exit, then SIGKILL the group."""
        if self.exited:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), grace + 2)
        except TimeoutError:
            self.kill()
            await self.process.wait()
        self._forwarding.cancel()

    def kill(self) -> None:
        """SIGKILL the whole process group at once."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
