"""A pool's workers kept alive: spawned ones started, checked and restarted, remote ones watched.

One asyncio task per worker owns that worker's state. A spawned worker's task starts it, waits
until `/health` answers and `/v1/models` lists its model (no deadline: loads take minutes, but a
process that exits fails at once), checks and scrapes it every `check_interval`, and restarts it
with exponential backoff when it dies or stops answering. A remote worker's task only checks it.

With several gateway processes (`--workers N`) only one of them spawns: the first to lock the
pool's lock file. The others watch the same ports as remote workers do, and one of them takes
over spawning if the lock's holder dies.

What a worker coming or going means for the requests waiting for it is the pool's
(`Balancer`): the supervisor only tells it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any, Protocol

import msgspec

from providers.contract.errors import GatewayError
from providers.contract.log import get_logger
from providers.contract.spec import Secret
from providers.contract.transport import Link, Transport
from providers.kinds.pool.engines import WorkerPlan
from providers.kinds.pool.leader import LeaderLock
from providers.kinds.pool.process import WorkerProcess, port_taken, state_dir
from providers.kinds.pool.scrape import parse_metrics
from providers.kinds.pool.settings import PoolSettings
from providers.kinds.pool.worker import Worker, WorkerState

FAILED_CHECKS = 3  # health checks failed in a row before a ready worker counts as failed
STABLE_AFTER = 60.0  # seconds ready after which the restart backoff starts over
CHECK_TIMEOUT = 5.0  # seconds for one health check or scrape, connect included
CHECK_CONNECT = 2.0
CHECK_HEADERS = {"Accept": "*/*"}
LOADING_POLL = 0.5
DRAIN_POLL = 0.05


class Balancer(Protocol):
    """What the pool does when a worker comes or goes (`Pool`)."""

    def serve_line(self, worker: Worker) -> None:
        """The worker may take requests: hand its free slots to whoever waits."""

    def left(self, worker: Worker) -> None:
        """The worker left service: whoever waits only for it fails over."""

    def forget(self, worker: Worker) -> None:
        """The worker restarts with an empty cache: no request is sent to it for its prefix."""


def check_headers(key: Secret | None) -> dict[str, str]:
    """A health check's headers: the workers' key when they want one (vLLM's `--api-key`
    guards `/v1/models` too)."""
    if key is None:
        return CHECK_HEADERS
    return {**CHECK_HEADERS, "Authorization": f"Bearer {key.reveal()}"}


class Supervisor:
    """The tasks that own a pool's workers' states, and the processes of the spawned ones."""

    def __init__(self, name: str, settings: PoolSettings, transport: Transport, link: Link,
                 plans: Mapping[str, WorkerPlan], workers: Mapping[str, Worker],
                 balancer: Balancer, key: Secret | None = None) -> None:
        self.settings = settings  # the pool's, replaced by a reload's (`Pool.update`)
        self.check_headers = check_headers(key)
        self.transport = transport
        self.link = link
        self.plans = plans
        self.workers = workers
        self._balancer = balancer
        self._lock = LeaderLock(f"{settings.host}-{settings.port}", state_dir())
        self._processes: dict[str, WorkerProcess] = {}
        self._wake: dict[str, asyncio.Event] = {n: asyncio.Event() for n in workers}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.log = get_logger().bind(pool=name)

    def start(self) -> None:
        """One task per worker: supervising the spawned, watching the rest."""
        for worker in self.workers.values():
            run = self._run_planned(self.plans[worker.name]) if worker.name in self.plans \
                else self._watch(worker)
            self._tasks.append(asyncio.create_task(run, name=f"pool-{worker.name}"))

    def wake(self, worker: Worker) -> None:
        """Check `worker` now rather than at its next interval."""
        self._wake[worker.name].set()

    async def answers(self, worker: Worker) -> bool:
        """One health check now: whether the worker is well."""
        return await self._get(worker, worker.health_path) is not None

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
            if (taken := port_taken(plan.host, plan.port)) is not None:
                worker.move(WorkerState.STARTING)  # a start that failed at once
                worker.move(WorkerState.FAILED, taken)
                self.log.warning("worker_port_taken", worker=plan.name, reason=taken)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.max_restart_backoff)
                continue
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
                worker.load_s = round(loaded, 2)
                self.log.info("worker_ready", worker=plan.name, load_s=worker.load_s)
                self._balancer.serve_line(worker)
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
            self._balancer.left(worker)
        self._balancer.forget(worker)
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
                    self._balancer.left(worker)
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
                    self._balancer.serve_line(worker)
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
            self._balancer.serve_line(worker)  # a suspect worker's free slots are usable again
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
        """Drain every worker, let in-flight requests finish, then stop the processes."""
        self._stopping = True
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
