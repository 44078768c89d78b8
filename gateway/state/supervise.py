"""The process's background tasks (config reload, model discovery, the Redis sync), supervised.

A task that fails is logged with its traceback, restarted after a backoff that doubles with
each failure in a row (from `FIRST_BACKOFF` up to `MAX_BACKOFF`; a run longer than
`HEALTHY_RUN` starts the count again), and its state is on `/status.json`. A task that returns
is restarted the same way: these are loops that should never end. `stop()` cancels and awaits
every task, whatever state each is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from providers.contract.log import get_logger

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0
HEALTHY_RUN = 60.0


@dataclass(slots=True)
class TaskState:
    """What `/status.json` shows of one background task."""

    name: str
    state: str = "running"  # running, restarting
    restarts: int = 0
    last_error: str | None = None
    last_error_at: float | None = None


def backoff(failures_in_a_row: int) -> float:
    """Seconds before the next start after this many failures in a row."""
    return min(MAX_BACKOFF, FIRST_BACKOFF * 2.0 ** max(0, failures_in_a_row - 1))


class Supervisor:
    """Starts background tasks and keeps them running."""

    def __init__(self) -> None:
        self.states: dict[str, TaskState] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, name: str, run: Callable[[], Awaitable[None]]) -> None:
        """Run `run()` as the task `name`, restarting it whenever it ends."""
        state = self.states[name] = TaskState(name)
        self._tasks.append(asyncio.create_task(self._keep(run, state), name=name))

    async def _keep(self, run: Callable[[], Awaitable[None]], state: TaskState) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await run()
                problem = "RuntimeError: the task returned"
                error: BaseException | None = None
            except Exception as exc:  # everything but cancellation: the task must go on
                problem, error = f"{type(exc).__name__}: {exc}", exc
            failures = 1 if time.monotonic() - started > HEALTHY_RUN else failures + 1
            delay = backoff(failures)
            state.state, state.restarts = "restarting", state.restarts + 1
            state.last_error, state.last_error_at = problem[:500], time.time()
            get_logger().error("background_task_failed", task=state.name, error=problem[:500],
                               restart_in_s=delay, exc_info=error)
            await asyncio.sleep(delay)
            state.state = "running"

    def view(self) -> list[dict[str, Any]]:
        """Every task's state, for the status page."""
        return [asdict(state) for state in self.states.values()]

    async def stop(self) -> None:
        """Cancel every task and wait for each to end."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
