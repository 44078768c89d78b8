"""The pool: every worker balanced, and requests waiting in line for a slot on one.

A request takes a slot on one worker (`take`) and gives it back when its answer is done
(`release`). When every worker is sent all it may be (`max_sent`), the request waits in the
pool's line (`queue.Line`) for the next slot freed, within `max_queue` and `queue_timeout`.
Keeping the workers alive (spawning, checking, restarting, stopping) is the `Supervisor`'s; it
tells the pool when a worker comes or goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from providers.contract.errors import PoolFull, PoolNotReady
from providers.contract.pace import Pace
from providers.contract.spec import Secret
from providers.contract.transport import Link, Transport
from providers.kinds.pool.engines import LLAMACPP, WorkerPlan
from providers.kinds.pool.picking import Load, Policy, PrefixTable, choose
from providers.kinds.pool.queue import Line
from providers.kinds.pool.settings import PoolSettings
from providers.kinds.pool.supervisor import Supervisor, check_headers
from providers.kinds.pool.worker import Worker, WorkerState

# A llama.cpp worker's default max_queue: enough that a handful of clients at once wait their
# turn (as with Ollama or llama-server) while a flood is refused early with a Retry-After.
LLAMACPP_QUEUE = 16
LLAMACPP_SENT = 2  # sent to a llama.cpp worker at once: one running, the next ready to start


@dataclass(eq=False, slots=True)
class Slot:
    """One request's hold on one worker, from `Pool.take` or `Pool.acquire` to `Pool.release`."""

    worker: Worker
    since: float  # when it was taken, on the pool's clock


class Pool:
    """A pool provider's workers, shared by every snapshot that uses the same pool config."""

    def __init__(self, name: str, settings: PoolSettings, transport: Transport, link: Link,
                 plans: Sequence[WorkerPlan], engine: str | None,
                 clock: Callable[[], float] = time.monotonic, key: Secret | None = None) -> None:
        self.name = name
        self.clock = clock
        self.settings = settings
        self.engine = engine
        self.plans = {plan.name: plan for plan in plans}
        self.workers = {plan.name: Worker(plan.name, plan.base_url, frozenset({plan.model}),
                                          plan.health_path, plan.has_metrics)
                        for plan in plans}
        for number, url in enumerate(settings.workers):
            base = url.rstrip("/").removesuffix("/v1") + "/v1"
            self.workers[f"{name}-remote-{number}"] = Worker(
                f"{name}-remote-{number}", base, frozenset(), spawned=False)
        self.table = PrefixTable()
        self.policy = Policy()
        self.line: Line[Slot] = Line(clock)
        self._held: set[Slot] = set()
        self._paces: dict[str, Pace] = {}
        self.supervisor = Supervisor(name, settings, transport, link, self.plans, self.workers,
                                     self, key)

    async def start(self) -> None:
        """Begin supervising and watching; returns at once (workers load in the background)."""
        self.supervisor.start()

    # -- choosing ---------------------------------------------------------------------------

    def ready_for(self, model: str) -> list[Worker]:
        return [w for w in self.workers.values() if w.serves(model)]

    @property
    def max_queue(self) -> int | None:
        """Requests one worker may hold, sent to it or waiting in line for it (`max_queue`;
        on llama.cpp `LLAMACPP_QUEUE` by default); None: no bound (vLLM queues itself)."""
        if self.settings.max_queue is not None:
            return self.settings.max_queue
        return LLAMACPP_QUEUE if self.engine == LLAMACPP else None

    @property
    def max_sent(self) -> int | None:
        """Requests one worker is sent at once; the rest of its `max_queue` waits in line.
        llama.cpp runs one at a time: one running and the next ready to start."""
        bound = self.max_queue
        if self.engine == LLAMACPP:
            return min(LLAMACPP_SENT, bound or LLAMACPP_SENT)
        return bound

    def full(self, model: str) -> bool:
        """Every ready worker for `model` holds as many requests as it may, counting the line."""
        bound = self.max_queue
        ready = self.ready_for(model)
        held = sum(w.load.inflight for w in ready) + self.line.waiting(model)
        return bound is not None and bool(ready) and held >= bound * len(ready)

    def retry_after(self, model: str) -> float:
        """Seconds a request refused now should wait: what the line measured of its pace."""
        slots = (self.max_sent or 1) * len(self.ready_for(model))
        now = self.clock()
        oldest = max((now - s.since for s in self._held if s.worker.serves(model)), default=0.0)
        return self._pace(model).expected_wait(self.line.waiting(model), slots, oldest)

    def take(self, model: str, hashes: Sequence[int], exclude: set[str]) -> Slot | None:
        """A slot on the worker for one try, taken now: prefix affinity unless overloaded,
        else least loaded; never a worker already sent all it may be (`max_sent`)."""
        bound = self.max_sent
        loads: dict[str, Load] = {w.name: w.load for w in self.ready_for(model)
                                  if w.name not in exclude and not w.suspect
                                  and (bound is None or w.load.inflight < bound)}
        if not loads:
            return None
        return self._claim(self.workers[choose(loads, hashes, self.table, self.policy)])

    async def acquire(self, model: str, hashes: Sequence[int], within: float,
                      priority: int = 0) -> Slot | None:
        """A slot for a request's first try: free now, or the first to free up in the next
        `within` seconds while the line has room (ahead of waiters of a lower `priority`).
        None when no worker for `model` is ready; PoolFull when the line is full or the wait
        ran out, with when to come back."""
        if not self.line.waiting(model) and (slot := self.take(model, hashes, set())):
            return slot  # nobody waits ahead: first come, first served
        if not self._serving(model):
            return None  # nothing will free a slot: not ready, fail over now
        if self.full(model):
            raise PoolFull(f"pool {self.name}: every worker for {model} holds {self.max_queue} "
                           "requests (max_queue)", self.retry_after(model))
        try:
            return await self.line.wait(model, within, self.release, priority)
        except TimeoutError:
            raise PoolFull(f"pool {self.name}: no worker for {model} was free within "
                           f"{within:g}s (queue_timeout)", self.retry_after(model)) from None

    def release(self, slot: Slot) -> None:
        """A request is done with its worker: the slot goes to the first in line it serves."""
        if slot not in self._held:
            return  # released already
        self._held.discard(slot)
        worker = slot.worker
        bound = self.max_sent
        for model in worker.models:
            saturated = self.line.waiting(model) > 0 or (bound is not None and all(
                w.load.inflight >= bound for w in self.ready_for(model)))
            self._pace(model).released(self.clock() - slot.since, saturated)
        worker.load.inflight -= 1
        self.serve_line(worker)

    def _claim(self, worker: Worker) -> Slot:
        worker.load.inflight += 1
        slot = Slot(worker, self.clock())
        self._held.add(slot)
        return slot

    def serve_line(self, worker: Worker) -> None:
        """Hand the worker's free slots to whoever waits for a model it serves."""
        bound = self.max_sent

        def claim() -> Slot | None:
            free = worker.state is WorkerState.READY and not worker.suspect and (
                bound is None or worker.load.inflight < bound)
            return self._claim(worker) if free else None

        while self.line.hand(worker.serves, claim):
            pass

    def _serving(self, model: str) -> bool:
        """Whether a worker for `model` is ready and in good standing (will free slots)."""
        return any(not w.suspect for w in self.ready_for(model))

    def left(self, worker: Worker) -> None:
        """A worker left service: whoever waits for a model no worker serves any more fails
        over now rather than at its deadline."""
        for model in worker.models:
            if not self._serving(model):
                self.line.abandon(model, PoolNotReady(self.not_ready_reason(model)))

    def _pace(self, model: str) -> Pace:
        pace = self._paces.get(model)
        if pace is None:
            pace = self._paces[model] = Pace(self.clock)
        return pace

    def update(self, settings: PoolSettings, key: Secret | None = None) -> None:
        """Take a reload's settings that apply live (limits, timings, the workers' key); what
        workers run is the same (`settings.fingerprint`), or this pool would have been
        replaced."""
        self.settings = self.supervisor.settings = settings
        self.supervisor.check_headers = check_headers(key)
        for worker in self.workers.values():
            self.serve_line(worker)  # a larger max_queue may free slots now

    def forget(self, worker: Worker) -> None:
        """A worker restarting keeps none of its cache: prefixes no longer lead to it."""
        self.table.forget(worker.name)

    async def answers(self, worker: Worker) -> bool:
        """One health check now: whether the worker is well (a request it refused may be the
        request's fault, not the worker's)."""
        return await self.supervisor.answers(worker)

    def suspect(self, worker: Worker) -> None:
        """A request to it failed: skip it until its next check, and check it now."""
        worker.suspect = True
        self.supervisor.wake(worker)

    def loading(self, model: str) -> bool:
        """Whether `model` has no ready worker and one loading it."""
        mine = [w for w in self.workers.values() if model in w.models]
        return bool(mine) and all(w.state is not WorkerState.READY for w in mine) and any(
            w.state is WorkerState.STARTING for w in mine)

    def not_ready_reason(self, model: str) -> str:
        """Why no worker can take a request for `model` now, for the failover message."""
        mine = [w for w in self.workers.values() if model in w.models or not w.spawned]
        if not mine:
            return f"pool {self.name}: no worker serves {model}"
        states = ", ".join(f"{w.name} {w.state.value} {time.monotonic() - w.since:.0f}s"
                           for w in mine)
        return f"pool {self.name}: no ready worker for {model} ({states})"

    def view(self) -> dict[str, object]:
        return {"engine": self.engine, "waiting": self.line.waiting(),
                "workers": [w.view() for w in self.workers.values()]}

    async def close(self) -> None:
        """Stop routing to every worker, let in-flight requests finish, then stop processes."""
        self.line.close(PoolNotReady(f"pool {self.name} is stopping"))
        await self.supervisor.close()
