"""The batch runner: one supervised task per process that runs the batches' requests through the
pipeline, a bounded number at a time, and ends each batch with its output and error files.

Each request goes through `relay.handle` as the key that made the batch, at the lowest priority
(`x-llms-priority`: the queue's last turn, and the pool's line's), so batches use what
interactive traffic leaves. Every step is a database change: a request is held by this process
for a lease it renews while it runs, its result is kept once, and a batch ends in one
transaction. So a gateway restarted mid-batch picks up the requests not yet done (those it was
running when it stopped were let go; a process that died holds its own until the lease lapses).
A request the gateway could not take now (its queue full, the key's rate limit) goes back to
pending for later, not to the error file; so does one every provider failed (a 5xx or a 429:
a pool still loading after a restart, an outage), up to `TRIES` times, after its `Retry-After`
or a backoff that doubles. A 4xx is the request's own: its answer goes to the error file.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Mapping

from gateway.accounts.service import Charge
from gateway.batches import jsonl, owners
from gateway.batches.store import COMPLETED, FAILED, Held, Store, new_id
from gateway.core.call import Call, Meter, Reader
from gateway.core.delivery import Streamed
from gateway.core.errors import DatabaseUnavailable
from gateway.core.limits import PRIORITY_BOUND
from gateway.core.record import Record, request_id
from gateway.core.settings import BatchesConfig
from gateway.pipeline import relay
from gateway.queue.queueing import PRIORITY_HEADER
from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError, error_body
from providers.contract.log import get_logger
from providers.contract.stream import close_quietly

# Answers that say "not now" (the gateway's queue, the key's limits, the database): the request
# waits its turn again instead of failing.
NOT_NOW = frozenset({"overloaded", "queue_timeout", "rate_limit_exceeded",
                     "database_unavailable", "server_shutting_down"})
# Answers every provider gave for now (overloaded, down, rate limited): tried again later.
AGAIN = frozenset({429, 500, 502, 503, 504})
TRIES = 6  # a request failing so that many times is answered with its last failure
MAX_BACKOFF = 60.0
LOWEST = str(-PRIORITY_BOUND)
# What a batch line's call says of itself: the queue's last turn, a JSON body.
_HEADERS: Mapping[str, str] = {PRIORITY_HEADER: LOWEST, "content-type": "application/json"}


def _reader(body: bytes) -> Reader:
    async def read(meter: Meter) -> bytes:  # held by the runner already: nothing more is read
        return body

    return read


class Runner:
    """This process's share of the batches' work."""

    def __init__(self, store: Store, runtime: Runtime,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.runtime = runtime
        self.clock = clock
        self.me = secrets.token_hex(8)  # this process, in the requests it holds
        self.running: set[asyncio.Task[None]] = set()
        self.wake = asyncio.Event()
        # The budget holds of batches this process made that an upstream runs (`charges`),
        # by batch id, until they end.
        self.holds: dict[str, Charge] = {}

    async def run(self) -> None:
        """Forever: take work, start it, end the batches that are done (supervised)."""
        try:
            while True:
                settings = self.runtime.live.snapshot.batches
                try:
                    await self.step(settings)
                except DatabaseUnavailable as exc:  # down, or another process wrote first
                    get_logger().warning("batches_step_skipped", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settings.poll_interval):
                        await self.wake.wait()
                self.wake.clear()
        except asyncio.CancelledError:
            await self._stop()
            raise

    async def step(self, settings: BatchesConfig) -> None:
        """One look at the database: hold and start what there is room for, end batches."""
        now = self.clock()
        if self.running:
            await self.store.renew(self.me, now + settings.lease)
        if not await self.store.active():
            return
        await self.store.start_validated(now)
        room = settings.concurrency - len(self.running)
        if room > 0:
            for held in await self.store.hold(self.me, now, settings.lease, room):
                task = asyncio.create_task(self._run(held))
                self.running.add(task)
                task.add_done_callback(self._done)
        for batch_id, status in await self.store.endable(now):
            await self._end(batch_id, status)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self.wake.set()

    async def _stop(self) -> None:
        """The process stops: what runs is cancelled and let go, for the next start."""
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.store.renew(self.me, 0.0)

    async def _run(self, held: Held) -> None:
        try:
            await self._answer(held)
        except GatewayError as exc:  # the database: the hold lapses, it runs again later
            get_logger().warning("batch_request_unsaved", batch=held.batch_id, line=held.line,
                                 error=str(exc))
        except Exception:
            get_logger().exception("batch_request_failed", batch=held.batch_id,
                                   line=held.line)

    async def _answer(self, held: Held) -> None:
        runtime = self.runtime
        live = runtime.live
        try:
            caller = owners.caller(held.owner, live.snapshot, runtime.accounts)
        except GatewayError as exc:
            body = live.redactor.encoded(error_body(exc))
            await self.store.finish(held.batch_id, held.line, FAILED,
                                    jsonl.answered(held.custom_id, exc.status, "", body), None)
            return
        endpoint = jsonl.ENDPOINTS[held.url]
        call = Call(endpoint, _HEADERS, Record(request_id(_HEADERS), endpoint, runtime.listeners),
                    _reader(held.body), key=caller, caller=True)
        try:
            answer = await relay.handle(call, runtime)
            if answer is None:  # nobody leaves a batch request: never, but not a result
                return
            if isinstance(answer, Streamed):  # a line cannot ask for one; read it whole
                try:
                    body = b"".join([chunk async for chunk in answer.chunks])
                finally:
                    await close_quietly(answer.chunks)
            else:
                body = answer.body
                answer.record.end(answer.outcome)
        finally:
            call.close()
        record = answer.record
        not_now = record.error_code in NOT_NOW
        failed = not not_now and answer.status in AGAIN and held.tries + 1 < TRIES
        if not_now or failed:
            backoff = 2.0 ** held.tries if failed else 1.0
            wait = min(MAX_BACKOFF, max(backoff, _retry_after(answer.headers)))
            await self.store.release(held.batch_id, held.line, self.clock() + wait, failed)
            return
        usage = record.usage
        tokens = (usage.prompt_tokens, usage.completion_tokens) if usage is not None else None
        state = COMPLETED if answer.status == 200 else FAILED
        await self.store.finish(held.batch_id, held.line, state,
                                jsonl.answered(held.custom_id, answer.status,
                                               record.request_id, body), tokens)

    async def _end(self, batch_id: str, status: str) -> None:
        """Write a batch's output and error files and end it as `status`."""
        now = self.clock()
        was: tuple[str, ...] = ("cancelling",) if status == "cancelled" else ("in_progress",)
        if status == "completed":
            await self.store.finalizing(batch_id, now)
            was = ("finalizing",)
        results = await self.store.results(batch_id)
        row = await self.store.batch_row(batch_id)
        if row is None:
            return
        output = [r["result"] for r in results if r["state"] == COMPLETED]
        errors = [r["result"] for r in results if r["state"] == FAILED]
        if status == "expired":
            errors += [jsonl.unanswered(r["custom_id"], "batch_expired",
                                        "This request could not be executed before the "
                                        "completion window expired.")
                       for r in results if r["state"] not in (COMPLETED, FAILED)]
        made, changes = [], {"status": status, f"{status}_at": now}
        for name, lines in (("output_file_id", output), ("error_file_id", errors)):
            if lines:
                content = b"".join(bytes(line) + b"\n" for line in lines)
                file_id = new_id("file-")
                made.append({"id": file_id, "owner": row["owner"],
                             "filename": f"{batch_id}_{name.split('_')[0]}.jsonl",
                             "purpose": "batch_output", "bytes": len(content),
                             "created_at": now, "content": content})
                changes[name] = file_id
        if await self.store.end(batch_id, was, changes, made):
            get_logger().info("batch_ended", batch=batch_id, status=status,
                              completed=len(output), failed=len(errors))


def _retry_after(headers: Mapping[str, str]) -> float:
    for name, value in headers.items():
        if name.lower() == "retry-after":
            with contextlib.suppress(ValueError):
                return float(value)
    return 0.0
