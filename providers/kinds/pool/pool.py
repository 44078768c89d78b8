"""The pool: spawned workers supervised, remote workers watched, every worker balanced.

One asyncio task per worker owns that worker's state. A spawned worker's task starts it, waits
until `/health` answers and `/v1/models` lists its model (no deadline: loads take minutes, but a
process that exits fails at once), checks and scrapes it every `check_interval`, and restarts it
with exponential backoff when it dies or stops answering. A remote worker's task only checks it.

With several gateway processes (`--workers N`) only one of them spawns: the first to lock the
pool's lock file. The others watch the same ports as remote workers do, and one of them takes
over spawning if the lock's holder dies.

A request takes a slot on one worker (`take`) and gives it back when its answer is done
(`release`). When every worker is sent all it may be (`max_sent`), the request waits in the
pool's line (`queue.Line`) for the next slot freed, within `max_queue` and `queue_timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from providers.contract.errors import GatewayError, PoolFull, PoolNotReady
from providers.contract.log import get_logger
from providers.contract.pace import Pace
from providers.contract.spec import Secret
from providers.contract.transport import Link, Transport
from providers.kinds.pool.engines import LLAMACPP, WorkerPlan
from providers.kinds.pool.leader import LeaderLock
from providers.kinds.pool.picking import Load, Policy, PrefixTable, choose
from providers.kinds.pool.process import WorkerProcess
from providers.kinds.pool.queue import Line
from providers.kinds.pool.scrape import parse_metrics
from providers.kinds.pool.settings import PoolSettings
from providers.kinds.pool.worker import Worker, WorkerState

FAILED_CHECKS = 3  # health checks failed in a row before a ready worker counts as failed
# A llama.cpp worker's default max_queue: enough that a handful of clients at once wait their
# turn (as with Ollama or llama-server) while a flood is refused early with a Retry-After.
LLAMACPP_QUEUE = 16
LLAMACPP_SENT = 2  # sent to a llama.cpp worker at once: one running, the next ready to start
STABLE_AFTER = 60.0  # seconds ready after which the restart backoff starts over
CHECK_TIMEOUT = 5.0  # seconds for one health check or scrape, connect included
CHECK_CONNECT = 2.0
CHECK_HEADERS = {"Accept": "*/*"}
LOADING_POLL = 0.5
DRAIN_POLL = 0.05


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
        self.check_headers = _check_headers(key)
        self.clock = clock
        self.settings = settings
        self.transport = transport
        self.link = link
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
        self._lock = LeaderLock(f"{settings.host}-{settings.port}")
        self._processes: dict[str, WorkerProcess] = {}
        self._wake: dict[str, asyncio.Event] = {n: asyncio.Event() for n in self.workers}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.line: Line[Slot] = Line(clock)
        self._held: set[Slot] = set()
        self._paces: dict[str, Pace] = {}
        self.log = get_logger().bind(pool=name)

    async def start(self) -> None:
        """Begin supervising and watching; returns at once (workers load in the background)."""
        for worker in self.workers.values():
            run = self._run_planned(self.plans[worker.name]) if worker.name in self.plans \
                else self._watch(worker)
            self._tasks.append(asyncio.create_task(run, name=f"pool-{worker.name}"))

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
        self._serve_line(worker)

    def _claim(self, worker: Worker) -> Slot:
        worker.load.inflight += 1
        slot = Slot(worker, self.clock())
        self._held.add(slot)
        return slot

    def _serve_line(self, worker: Worker) -> None:
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

    def _left(self, worker: Worker) -> None:
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
        self.settings = settings
        self.check_headers = _check_headers(key)
        for worker in self.workers.values():
            self._serve_line(worker)  # a larger max_queue may free slots now

    async def answers(self, worker: Worker) -> bool:
        """One health check now: whether the worker is well (a request it refused may be the
        request's fault, not the worker's)."""
        return await self._get(worker, worker.health_path) is not None

    def suspect(self, worker: Worker) -> None:
        """A request to it failed: skip it until its next check, and check it now."""
        worker.suspect = True
        self._wake[worker.name].set()

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

    # -- spawned workers ------------------------------------------------------------------

    async def _run_planned(self, plan: WorkerPlan) -> None:
        worker = self.workers[plan.name]
        if not self._lock.try_acquire():
            self.log.info("pool_following", worker=plan.name, lock=str(self._lock.path))
            await self._watch(worker, until_leader=True)
        await self._supervise(plan, worker)

    async def _supervise(self, plan: WorkerPlan, worker: Worker) -> None:
        backoff = self.settings.restart_backoff
        while not self._stopping:
            worker.move(WorkerState.STARTING)
            process = await WorkerProcess.spawn(plan.name, plan.argv, plan.env,
                                                self.settings.shutdown_grace)
            self._processes[plan.name] = process
            worker.pid = process.pid
            self.log.info("worker_starting", worker=plan.name, worker_pid=process.pid,
                          argv=plan.loggable_argv(), env=plan.loggable_env(),
                          output=str(process.log_path))
            ready_for = 0.0
            if await self._until_ready(worker, process) and not self._stopping:
                loaded = time.monotonic() - worker.since
                worker.move(WorkerState.READY)
                self.log.info("worker_ready", worker=plan.name, load_s=round(loaded, 2))
                self._serve_line(worker)
                reason = await self._while_ready(worker, process)
                ready_for = time.monotonic() - worker.since
            else:
                reason = f"exited while loading (code {process.process.returncode}): " \
                         f"{process.last_words() or 'no output'}{plan.failure_hint()}"
            if self._stopping:
                return  # close() stops the process
            await self._failed(worker, process, reason)
            if ready_for > STABLE_AFTER:
                backoff = self.settings.restart_backoff
            self.log.info("worker_restarting", worker=plan.name, in_s=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.max_restart_backoff)
            worker.restarts += 1

    async def _until_ready(self, worker: Worker, process: WorkerProcess) -> bool:
        """Poll until the worker lists its model; False as soon as the process exits."""
        while not process.exited and not self._stopping:
            listed = await self._probe(worker)
            if listed is not None and worker.models <= listed:
                return True
            await asyncio.sleep(LOADING_POLL)
        return False

    async def _while_ready(self, worker: Worker, process: WorkerProcess) -> str:
        """Check and scrape until the worker dies or stops answering; why it is no more."""
        exited = asyncio.ensure_future(process.wait())
        try:
            while True:
                if await self._sleep_or_exit(worker, exited):
                    return f"exited (code {exited.result()}): {process.last_words() or '-'}"
                if not await self._check(worker):
                    return f"failed {FAILED_CHECKS} health checks in a row"
        finally:
            exited.cancel()

    async def _failed(self, worker: Worker, process: WorkerProcess, reason: str) -> None:
        if worker.state is not WorkerState.DRAINING:
            worker.move(WorkerState.FAILED, reason)
            self._left(worker)
        self.table.forget(worker.name)
        worker.suspect = False
        self.log.warning("worker_failed", worker=worker.name, worker_pid=process.pid,
                         reason=reason)
        process.kill()  # a hung worker is still running; a dead one leaves children to reap
        await process.wait()

    # -- checks ---------------------------------------------------------------------------

    async def _watch(self, worker: Worker, until_leader: bool = False) -> None:
        """Check a worker we do not own, forever (or until this process becomes the leader)."""
        worker.move(WorkerState.STARTING)
        while not self._stopping:
            if until_leader and self._lock.try_acquire():
                self.log.info("pool_leading", worker=worker.name)
                worker.move(WorkerState.FAILED, "taking over from another gateway process")
                return
            if worker.state is WorkerState.READY:
                healthy = await self._check(worker)
                if not healthy and not self._stopping:
                    worker.move(WorkerState.FAILED, "stopped answering its health check")
                    self._left(worker)
                    self.log.warning("worker_failed", worker=worker.name, reason="health check")
            else:
                listed = await self._probe(worker)
                # A worker we planned must list its model; a remote one serves what it lists.
                wanted = worker.models if worker.spawned else frozenset()
                if listed and wanted <= listed and not self._stopping:
                    worker.move(WorkerState.STARTING)  # from failed, when it comes back
                    worker.models = worker.models if worker.spawned else listed
                    worker.move(WorkerState.READY)
                    self.log.info("worker_ready", worker=worker.name, models=sorted(listed))
                    self._serve_line(worker)
            await self._sleep(worker)

    async def _probe(self, worker: Worker) -> frozenset[str] | None:
        """The models a worker lists once healthy; None while it is not."""
        if worker.health_path != "/v1/models" and await self._get(worker, worker.health_path) \
                is None:
            return None
        listing = await self._get(worker, "/v1/models")
        if listing is None:
            return None
        try:
            data = msgspec.json.decode(listing).get("data") or []
            return frozenset(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
        except (msgspec.DecodeError, AttributeError, TypeError):
            return None

    async def _check(self, worker: Worker) -> bool:
        """One health check (and metrics scrape); False after FAILED_CHECKS failures in a row."""
        healthy = await self._get(worker, worker.health_path) is not None
        if healthy and worker.has_metrics and (text := await self._get(worker, "/metrics")):
            engine = parse_metrics(text.decode("utf-8", "replace"))
            worker.load.running, worker.load.waiting = engine.running, engine.waiting
            worker.load.kv_cache = engine.kv_cache
        if healthy:
            worker.failed_checks, worker.suspect = 0, False
            self._serve_line(worker)  # a suspect worker's free slots are usable again
            return True
        worker.failed_checks += 1
        return worker.failed_checks < FAILED_CHECKS

    async def _get(self, worker: Worker, path: str) -> bytes | None:
        """The body of a 200 answer to GET `path` on `worker`, or None (any failure)."""
        try:
            async with asyncio.timeout(CHECK_TIMEOUT):
                response = await self.transport.request(
                    "GET", worker.root + path, headers=self.check_headers, link=self.link,
                    connect_timeout=CHECK_CONNECT)
                try:
                    return await response.read() if response.status == 200 else None
                finally:
                    response.close()
        except (GatewayError, TimeoutError):
            return None

    async def _sleep(self, worker: Worker) -> None:
        event = self._wake[worker.name]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), self.settings.check_interval)
        event.clear()

    async def _sleep_or_exit(self, worker: Worker, exited: asyncio.Future[int]) -> bool:
        """Wait one interval (or a wake-up); True if the process exited meanwhile."""
        woken = asyncio.ensure_future(self._sleep(worker))
        waiting: set[asyncio.Future[Any]] = {woken, exited}
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        return exited.done()

    # -- stopping ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop routing to every worker, let in-flight requests finish, then stop processes."""
        self._stopping = True
        self.line.close(PoolNotReady(f"pool {self.name} is stopping"))
        for worker in self.workers.values():
            if worker.state in (WorkerState.READY, WorkerState.STARTING, WorkerState.FAILED):
                worker.move(WorkerState.DRAINING)
        await self._drained(self.settings.drain_timeout)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(p.stop(self.settings.shutdown_grace)
                               for p in self._processes.values()))
        for worker in self.workers.values():
            if worker.state is WorkerState.DRAINING:
                worker.move(WorkerState.STOPPED)
        self._lock.release()
        self.log.info("pool_stopped", workers=len(self.workers))

    async def _drained(self, within: float) -> None:
        """Wait until no request is in flight on any worker, or `within` seconds."""
        for _ in range(max(1, int(within / DRAIN_POLL))):
            if not any(w.load.inflight for w in self.workers.values()):
                return
            await asyncio.sleep(DRAIN_POLL)


def _check_headers(key: Secret | None) -> dict[str, str]:
    """A health check's headers: the workers' key when they want one (vLLM's `--api-key`
    guards `/v1/models` too)."""
    if key is None:
        return CHECK_HEADERS
    return {**CHECK_HEADERS, "Authorization": f"Bearer {key.reveal()}"}
