"""The request log's listener and writer: a row per request, written off the request path.

When a request's record ends, `Journal.ended` (a listener, `gateway.observe.observers`) makes
its row, a tuple of plain values, and puts it in a bounded buffer: the record itself is not held
(a second's records, alive until their batch is written, kept the garbage collector busy). The
bodies a row keeps are redacted and cut, and the batch written, by the journal's own task
(`run`), once per `database.flush_interval`, as spend rows are. A database that is down leaves
rows buffered (the oldest dropped past `MAX_BUFFERED`, counted) and bodies held up to
`MAX_HELD_BYTES` (past it, a row keeps its metadata and says `not_captured`). The same task
purges rows past `logs.retention_days` and `logs.max_rows` every `logs.purge_interval` seconds,
in small batches (`store.Store.purge`).

With no `logs` section in llms.json no row is written; a 401 is nobody's request and is never
logged (a flood of them would push real rows out).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

import msgspec

from gateway.core.errors import DatabaseUnavailable
from gateway.core.record import Outcome, Record
from gateway.core.settings import Route
from gateway.core.settings.logs import LogsConfig
from gateway.observe.observers import status_of
from gateway.requestlog.capture import DISABLED, NOT_CAPTURED, STORED, Bodies
from gateway.requestlog.store import PLAIN, Spelling, Store
from providers.contract.log import get_logger
from providers.contract.redact import Redactor, mask_credentials

UNAUTHENTICATED = 401
MAX_BUFFERED = 50_000  # rows waiting to be written
MAX_HELD_BYTES = 64 * 1024 * 1024  # bodies waiting with them
BATCH_ROWS = 1_000  # rows per insert
BATCH_BYTES = 8 * 1024 * 1024  # ... and bodies per insert
Row = tuple[Any, ...]
# A row's `outcome`, looked up: reading an enum member's `value` calls a descriptor, on 3.11.
_OUTCOMES: Mapping[Outcome | None, str] = MappingProxyType(
    {None: "unknown", **{outcome: outcome.value for outcome in Outcome}})


@dataclass(slots=True)
class Held:
    """A buffered row whose bodies wait for the writer to redact and cut them."""

    row: Row
    bodies: Bodies
    size: int  # their bytes


class Journal:
    """The request log of one process: its buffer, its writer, its purge."""

    def __init__(self, store: Store, settings: Callable[[], LogsConfig | None],
                 redactor: Callable[[], Redactor],
                 route_of: Callable[[str, str], Route | None],
                 cost_of: Callable[[Record], float | None],
                 flush_interval: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings  # the live config's `logs` (None: off)
        self.redactor = redactor  # the live config's
        self.route_of = route_of  # (alias, provider) -> the route that served
        self.cost_of = cost_of  # what the request is charged, as its spend row says
        self.flush_interval = flush_interval
        self.clock = clock
        # Rows in the order their requests ended; a row that kept bodies waits as `Held`.
        self.buffer: deque[Row | Held] = deque()
        self.held = 0  # bytes of bodies in the buffer
        self.dropped = 0  # rows lost to a full buffer while the database was down
        self._purged = 0.0
        # The upstream models and first tries' attempts, found once per batch written.
        self._models, self._chains = _Models(route_of), _Chains()
        self._spelling = store.spelling
        self._null = null = store.spelling.null
        # A row's last columns (payload, request_body, response_body) when it keeps no bodies,
        # and while its bodies wait for the writer.
        self._payloads = {state: (state, null, null) for state in (DISABLED, NOT_CAPTURED)}
        self._unwritten = (STORED, null, null)

    def ended(self, record: Record) -> None:
        """The record's listener: the request's row buffered (its bodies, if kept, with it)."""
        if record.status == UNAUTHENTICATED or (settings := self.settings()) is None:
            return
        buffer = self.buffer
        if len(buffer) >= MAX_BUFFERED:
            if isinstance(lost := buffer.popleft(), Held):
                self.held -= lost.size
            self.dropped += 1
        bodies, kept = record.bodies, None
        if isinstance(bodies, Bodies):
            if bodies.held and self.held + bodies.held <= MAX_HELD_BYTES:
                kept = bodies
            else:
                bodies = NOT_CAPTURED
        if kept is not None:
            payload = self._unwritten
        elif isinstance(bodies, str):
            payload = self._payloads.get(bodies) or (bodies, self._null, self._null)
        else:  # refused before the capture stage decided
            payload = self._payloads[NOT_CAPTURED if settings.capture == "bodies" else DISABLED]
        made = row(self.clock(), record, self.cost_of(record), self._models.of(record), payload,
                   self._chains.of(record), self._spelling)
        if kept is None:
            buffer.append(made)
        else:
            self.held += kept.held
            buffer.append(Held(made, kept, kept.held))

    async def run(self) -> None:
        """Forever: the buffer written, old rows purged."""
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
                await self.purge()
            except DatabaseUnavailable as exc:
                get_logger().warning("request_log_unwritten", rows=len(self.buffer),
                                     error=str(exc))

    async def flush(self) -> None:
        """Write the buffered rows, a batch at a time; on failure the batch stays, in order."""
        buffer = self.buffer
        while buffer:
            size = 0
            if not self.held:  # the usual case: rows only, taken without a look at each
                if len(buffer) <= BATCH_ROWS:
                    batch = list(buffer)
                    buffer.clear()
                else:
                    batch = [buffer.popleft() for _ in range(BATCH_ROWS)]
            else:
                batch = []
                while buffer and len(batch) < BATCH_ROWS and size < BATCH_BYTES:
                    batch.append(entry := buffer.popleft())
                    size += entry.size if isinstance(entry, Held) else 0
            self._models, self._chains = _Models(self.route_of), _Chains()
            try:
                await self.store.write(self.rows(batch) if size else cast(list[Row], batch))
            except BaseException:
                buffer.extendleft(reversed(batch))
                raise
            self.held -= size

    async def purge(self, now: float | None = None) -> int:
        """Rows past the retention deleted, once every `logs.purge_interval` seconds (or now,
        given the time); how many went."""
        settings = self.settings()
        at = self.clock() if now is None else now
        if settings is None or (now is None and at - self._purged < settings.purge_interval):
            return 0
        self._purged = at
        return await self.store.purge(at - settings.retention_days * 86400, settings.max_rows)

    async def close(self) -> None:
        """Write what is buffered, if the database answers."""
        try:
            await self.flush()
        except DatabaseUnavailable as exc:
            get_logger().warning("request_log_unwritten", rows=len(self.buffer),
                                 error=str(exc))

    def rows(self, batch: list[Row | Held]) -> list[Row]:
        """Each buffered row as written (tuples in `COLUMNS`' order): its bodies, if it kept
        any, redacted and cut."""
        most, redactor = (self.settings() or LogsConfig()).max_body_bytes, self.redactor()
        null = self.store.spelling.null
        return [entry.row[:-3] + _stored(entry.bodies, most, redactor, null)
                if isinstance(entry, Held) else entry for entry in batch]

    def status(self) -> dict[str, Any]:
        """What `/status.json` says of the request log: on or off, rows waiting to be written,
        rows lost while the database was down."""
        return {"on": self.settings() is not None, "buffered": len(self.buffer),
                "dropped": self.dropped}


class _Models:
    """The upstream model that served each (alias, provider), looked up once per batch."""

    def __init__(self, route_of: Callable[[str, str], Route | None]) -> None:
        self.route_of = route_of
        self.found: dict[tuple[str | None, str | None], str | None] = {}

    def of(self, record: Record) -> str | None:
        served = (record.alias if record.known_model else None, record.provider)
        try:
            return self.found[served]
        except KeyError:
            alias, provider = served
            route = self.route_of(alias, provider) \
                if alias is not None and provider is not None else None
            found = self.found[served] = route.upstream_model if route is not None else None
            return found


class _Chains:
    """The attempts of a request answered at its first try, encoded once per batch and
    provider: most requests' chain is one of a handful."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    def of(self, record: Record) -> str | None:
        provider = record.provider
        if provider is None or record.failed or record.lost or record.from_store \
                or record.hedge_won or (record.resumes is not None and record.resumes.ok):
            return None
        if (chain := self.found.get(provider)) is None:
            chain = self.found[provider] = msgspec.json.encode(attempts(record)).decode()
        return chain


def row(at: float, record: Record, cost: float | None, model: str | None,
        bodies: tuple[str, Any, Any], chain: str | None = None, spelling: Spelling = PLAIN
        ) -> Row:
    """One request's row, in `COLUMNS`' order (a plain tuple: the writer makes one per
    request, on the same core as the requests): `at` when it ended (its `time` is when it
    arrived), `bodies` its payload's state and its bodies as kept, `chain` its attempts as
    JSON if already encoded, NULL and booleans as `spelling` says (pure)."""
    null, flags = spelling.null, spelling.flags
    usage, resumes, guardrails = record.usage, record.resumes, record.guardrails
    key, team, alias = record.key_id, record.team, record.alias if record.known_model else None
    ttft, overhead, error = record.ttft, record.overhead, record.error_code
    provider, duration = record.provider, record.duration
    if usage is None:
        prompt = completion = cached = written = null
    else:
        prompt, completion = usage.prompt_tokens, usage.completion_tokens
        cached, written = usage.cached_tokens, usage.cache_write_tokens
    # Milliseconds to the microsecond (`round(x, 3)` formats the float: many times dearer).
    return (
        at - duration, record.request_id, null if key is None else key,
        null if team is None else team, record.endpoint,
        null if (requested := record.model) is None else requested,
        null if alias is None else alias, null if model is None else model,
        null if provider is None else provider, flags[record.stream],
        chain or msgspec.json.encode(attempts(record)).decode(),
        flags[record.hedged], flags[record.hedge_won], flags[record.cache_hit],
        flags[record.replayed], resumes.ok if resumes is not None else 0,
        msgspec.json.encode(guardrails).decode() if guardrails else "[]",
        null if ttft is None else round(ttft * 1_000_000) / 1000, duration * 1000,
        null if overhead is None else round(overhead * 1_000_000) / 1000,
        prompt, completion, cached, written, null if cost is None else cost,
        status_of(record), null if error is None else error, _OUTCOMES[record.outcome], *bodies)


def attempts(record: Record) -> list[dict[str, Any]]:
    """The tries the request made, in order: each that failed (provider, status, reason),
    each hedge that lost its race, and the one that answered (pure)."""
    chain: list[dict[str, Any]] = [
        {"provider": a.provider, "outcome": "failed", "status": a.status, "reason": a.reason}
        for a in record.failed]
    chain += [{"provider": provider, "outcome": "lost", "hedge": not record.hedge_won}
              for provider in record.lost]
    if record.provider is not None and not record.from_store:
        chain.append({"provider": record.provider, "outcome": "answered",
                      "hedge": record.hedge_won})
    resumes = record.resumes
    if resumes is not None and resumes.by is not None and resumes.ok:
        chain.append({"provider": resumes.by, "outcome": "resumed"})
    return chain


def _stored(bodies: Bodies, most: int, redactor: Redactor, null: Any
            ) -> tuple[str, str, Any]:
    """The bodies as stored: redacted, then cut to `most` bytes (no answer: `null`)."""
    request = f"[multipart upload: {bodies.uploaded} bytes, not kept]" if bodies.uploaded \
        else rendered(bodies.request, most, redactor)
    answer = "".join(bodies.text) if bodies.text else bodies.answer.decode("utf-8", "replace")
    return STORED, request, rendered(answer, most, redactor) if answer else null


def rendered(data: bytes | str, most: int, redactor: Redactor) -> str:
    """Content as stored: secrets and key-shaped tokens removed, then cut to `most` bytes at
    a character's end (the margin read past the cut keeps a secret from being cut in two)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    cleaned = redactor.text(mask_credentials(text)).encode()
    return cleaned[:most].decode("utf-8", "ignore")

