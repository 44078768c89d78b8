"""A worker as the pool sees it: where it is, its state, its load.

    starting ──▶ ready ──▶ draining ──▶ stopped
       │  ▲        │                       │
       ▼  │        ▼                       │
      failed ◀─────┘      (stopped ──▶ starting when supervision resumes)

Only `ready` workers are picked. An illegal move raises: a supervisor bug shows up at once
instead of as a worker that silently never serves.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from providers.kinds.pool.picking import Load


class WorkerState(enum.Enum):
    STARTING = "starting"  # spawned (or being checked), not yet answering
    READY = "ready"  # healthy and serving its model
    DRAINING = "draining"  # no new requests; in-flight ones finish
    STOPPED = "stopped"
    FAILED = "failed"  # exited or unhealthy; restarted after a backoff (spawned workers)


_ALLOWED = {
    WorkerState.STARTING: {WorkerState.READY, WorkerState.FAILED, WorkerState.DRAINING,
                           WorkerState.STOPPED},
    WorkerState.READY: {WorkerState.DRAINING, WorkerState.FAILED},
    WorkerState.DRAINING: {WorkerState.STOPPED, WorkerState.FAILED},
    WorkerState.FAILED: {WorkerState.STARTING, WorkerState.DRAINING, WorkerState.STOPPED},
    WorkerState.STOPPED: {WorkerState.STARTING},
}


class IllegalTransition(RuntimeError):
    """A worker was asked to move between states that are not connected."""


@dataclass(slots=True)
class Worker:
    """One inference server in the pool: spawned by us, or remote (never spawned or killed)."""

    name: str
    base_url: str  # ends in /v1
    models: frozenset[str]  # the ids it serves (remote: as its /v1/models lists them)
    health_path: str = "/health"
    has_metrics: bool = True
    spawned: bool = True
    state: WorkerState = WorkerState.STOPPED
    since: float = field(default_factory=time.monotonic)
    load: Load = field(default_factory=Load)
    restarts: int = 0
    pid: int | None = None
    last_error: str | None = None
    failed_checks: int = 0
    suspect: bool = False  # a request to it just failed: skipped until its next good check
    load_s: float | None = None  # how long its last start took to be ready (spawned workers)

    def move(self, to: WorkerState, why: str | None = None) -> None:
        """Change state; IllegalTransition if the move is not in the diagram."""
        if to is self.state:
            return
        if to not in _ALLOWED[self.state]:
            raise IllegalTransition(f"worker {self.name}: {self.state.value} -> {to.value}")
        if to is WorkerState.STARTING:
            self.load_s = None  # a new start: the last one's load time no longer describes it
        self.state, self.since = to, time.monotonic()
        if why is not None:
            self.last_error = why

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def serves(self, model: str) -> bool:
        return self.state is WorkerState.READY and model in self.models

    def view(self) -> dict[str, Any]:
        """What /ready, /status.json and `llms-gateway ls` show of this worker: `for_s` is the
        time in its state, `load_s` how long its start took to be ready (None: not known)."""
        return {
            "name": self.name, "url": self.base_url, "state": self.state.value,
            "for_s": round(time.monotonic() - self.since, 1), "load_s": self.load_s,
            "spawned": self.spawned,
            "pid": self.pid, "models": sorted(self.models), "restarts": self.restarts,
            "inflight": self.load.inflight, "running": self.load.running,
            "waiting": self.load.waiting, "kv_cache": round(self.load.kv_cache, 3),
            "last_error": self.last_error,
        }
