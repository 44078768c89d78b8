"""Looking at a pool from outside: its workers in /ready, and whether their processes live."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.gateway_process import GatewayProcess


def workers(gateway: GatewayProcess, provider: str = "local") -> list[dict[str, Any]]:
    """The pool's workers as /ready shows them ([] before the pool has started)."""
    body = httpx.get(f"{gateway.url}/ready", timeout=5).json()
    entry = next(p for p in body["providers"] if p["name"] == provider)
    return list((entry.get("state") or {}).get("workers") or [])


def wait_for_workers(gateway: GatewayProcess, state: str, count: int = 1, timeout: float = 60,
                     provider: str = "local", **expected: Any) -> list[dict[str, Any]]:
    """Wait until `count` workers are in `state` (and match `expected` fields)."""
    deadline = time.monotonic() + timeout
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = [w for w in workers(gateway, provider) if w["state"] == state
                 and all(w.get(k) == v for k, v in expected.items())]
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"workers are {workers(gateway, provider)}; wanted {count} {state}\n"
                         f"{gateway.logs()[-4000:]}")


def alive(pid: int) -> bool:
    """A running process (a zombie nobody reaped counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children(pid: int) -> list[int]:
    """Direct children of a process (the worker under its reaper)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def wait_dead(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return
        time.sleep(0.05)
    raise AssertionError(f"still running: {[p for p in pids if alive(p)]}")
