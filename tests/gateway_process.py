"""Run the real gateway as a subprocess on a free loopback port, the way users run it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

# The tests' one way to wait for an effect, importable from here too, where it first lived.
from tests.waiting import wait_until as wait_until

ROOT = Path(__file__).resolve().parent.parent


def dies_with_us() -> None:
    """In a child before it runs: ask the kernel to SIGKILL it when the test run that started
    it dies, so a killed pytest leaves no gateway (nor Redis) behind holding ports."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def provider(base_url: str, models: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An `openai`-type provider entry with short test timeouts."""
    entry: dict[str, Any] = {"type": "openai", "base_url": base_url,
                             "api_key": "sk-test-secret-123456", "models": models}
    entry.update(extra)
    return entry


def config(providers: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A whole llms.json with fast defaults suited to tests."""
    doc: dict[str, Any] = {
        "server": {"reload_interval": 0.2},
        "defaults": {"timeouts": {"connect": 2, "first_token": 5, "idle": 5, "total": 20},
                     "retries": {"attempts": 1, "backoff": 0.05}},
        "providers": providers,
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    return doc


class GatewayProcess:
    """`python -m gateway serve` with a config file it owns; stopped by `stop()`."""

    def __init__(self, workdir: Path, doc: dict[str, Any], env: dict[str, str] | None = None,
                 filename: str = "llms.json", extra_args: tuple[str, ...] = (),
                 open_files: tuple[int, int] | None = None) -> None:
        self.workdir = workdir
        self.config_path = workdir / filename
        self.log_path = workdir / "gateway.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        self.write_config(doc)
        # A developer's own proxy settings would send the fakes' loopback traffic to that proxy:
        # proxies are what a test gives, nothing else.
        inherited = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        # Workers' output files (`providers.kinds.pool.process.log_dir`) go to this test's own dir.
        self._env = {**inherited, "XDG_STATE_HOME": str(workdir / "state"), **(env or {})}
        self._args = extra_args
        self._open_files = open_files  # (soft, hard) RLIMIT_NOFILE to start with
        self.process: subprocess.Popen[bytes] | None = None

    def write_config(self, doc: dict[str, Any] | str) -> None:
        """Replace the config file atomically, as an editor saving it would."""
        text = doc if isinstance(doc, str) else json.dumps(doc, indent=2)
        scratch = self.config_path.with_suffix(".tmp")
        scratch.write_text(text)
        scratch.replace(self.config_path)

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        """Spawn the gateway and return once /health answers: polled, so a generous deadline
        costs time only when the gateway never comes up (a machine others load starts slowly)."""
        command = [sys.executable, "-m", "gateway", "serve", "--config", str(self.config_path),
                   "--host", "127.0.0.1", "--port", str(self.port), *self._args]
        if self._open_files is not None:  # util-linux's prlimit execs the command: same pid
            soft, hard = self._open_files
            command = ["prlimit", f"--nofile={soft}:{hard}", "--", *command]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=self._env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=dies_with_us)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"gateway did not become healthy:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_events(self, event: str | None = None) -> list[dict[str, Any]]:
        """The JSON log lines so far, optionally only those with this `event`."""
        events = []
        for line in self.logs().splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if event is None or record.get("event") == event:
                    events.append(record)
        return events

    def wait_for_log(self, event: str, count: int = 1,
                     timeout: float = 5.0) -> list[dict[str, Any]]:
        """The `event` lines once there are `count`: a request's line is written just after its
        answer is sent, so a client holding the answer can be a moment ahead of the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.log_events(event)
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no {event!r} log line within {timeout}s:\n{self.logs()}")

    def request_line(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """The `request` log line of the request `request_id` (its answer's `x-request-id`),
        once written: just after its answer is sent."""
        return wait_until(lambda: next((line for line in self.log_events("request")
                                        if line.get("request_id") == request_id), None),
                          within=timeout, what=f"the request log line of {request_id}")

    def circuits(self, provider: str | None = None) -> list[dict[str, Any]]:
        """The breakers and cooldowns /ready shows (to anyone, on a gateway without keys),
        only `provider`'s if named: a state the tests wait on rather than sleeping through."""
        rows: list[dict[str, Any]] = httpx.get(f"{self.url}/ready", timeout=5).json()["circuits"]
        return [row for row in rows if provider is None or row["provider"] == provider]

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
