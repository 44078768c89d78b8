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
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.core.errors import DatabaseUnavailable
from gateway.core.record import Record
from gateway.core.settings import Route
from gateway.core.settings.logs import LogsConfig
from gateway.observe.observers import status_of
from gateway.requestlog.capture import DISABLED, NOT_CAPTURED, STORED, Bodies
from gateway.requestlog.store import Store
from providers.contract.log import get_logger
from providers.contract.redact import Redactor, mask_credentials

UNAUTHENTICATED = 401
MAX_BUFFERED = 50_000  # rows waiting to be written
MAX_HELD_BYTES = 64 * 1024 * 1024  # bodies waiting with them
BATCH_ROWS = 1_000  # rows per insert
BATCH_BYTES = 8 * 1024 * 1024  # ... and bodies per insert
NO_TOKENS = (None, None, None, None)
# A row's last columns (payload, request_body, response_body) while its bodies wait for the writer.
UNWRITTEN = (STORED, None, None)


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
        # (its row, its bodies while they wait to be redacted and cut, their bytes)
        self.buffer: deque[tuple[tuple[Any, ...], Bodies | None, int]] = deque()
        self.held = 0  # bytes of bodies in the buffer
        self.dropped = 0  # rows lost to a full buffer while the database was down
        self._purged = 0.0
        # The upstream models and first tries' attempts, found once per batch written.
        self._models, self._chains = _Models(route_of), _Chains()

    def ended(self, record: Record) -> None:
        """The record's listener: the request's row buffered (its bodies, if kept, with it)."""
        if record.status == UNAUTHENTICATED or (settings := self.settings()) is None:
            return
        buffer = self.buffer
        if len(buffer) >= MAX_BUFFERED:
            self.held -= buffer.popleft()[2]
            self.dropped += 1
        bodies, kept = record.bodies, None
        if isinstance(bodies, Bodies):
            if bodies.held and self.held + bodies.held <= MAX_HELD_BYTES:
                kept = bodies
                self.held += bodies.held
            else:
                bodies = NOT_CAPTURED
        made = row(self.clock(), record, self.cost_of(record), self._models(record),
                   _payload(bodies, settings) if kept is None else UNWRITTEN,
                   self._chains(record))
        buffer.append((made, kept, 0 if kept is None else kept.held))

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
        while self.buffer:
            batch: list[tuple[tuple[Any, ...], Bodies | None, int]] = []
            size = 0
            while self.buffer and len(batch) < BATCH_ROWS and size < BATCH_BYTES:
                batch.append(item := self.buffer.popleft())
                size += item[2]
            self._models, self._chains = _Models(self.route_of), _Chains()
            try:
                await self.store.write(self.rows(batch))
            except BaseException:
                self.buffer.extendleft(reversed(batch))
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

    def rows(self, batch: list[tuple[tuple[Any, ...], Bodies | None, int]]
             ) -> list[tuple[Any, ...]]:
        """Each buffered row as written (tuples in `COLUMNS`' order): its bodies, if it kept
        any, redacted and cut."""
        most, redactor = (self.settings() or LogsConfig()).max_body_bytes, self.redactor()
        return [made if bodies is None else made[:-3] + _stored(bodies, most, redactor)
                for made, bodies, _ in batch]

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

    def __call__(self, record: Record) -> str | None:
        alias, provider = served = (record.alias if record.known_model else None,
                                    record.provider)
        if served not in self.found:
            route = self.route_of(alias, provider) \
                if alias is not None and provider is not None else None
            self.found[served] = route.upstream_model if route is not None else None
        return self.found[served]


class _Chains:
    """The attempts of a request answered at its first try, encoded once per batch and
    provider: most requests' chain is one of a handful."""

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    def __call__(self, record: Record) -> str | None:
        provider = record.provider
        if provider is None or record.failed or record.lost or record.from_store \
                or record.hedge_won or (record.resumes is not None and record.resumes.ok):
            return None
        if (chain := self.found.get(provider)) is None:
            chain = self.found[provider] = msgspec.json.encode(attempts(record)).decode()
        return chain


def row(at: float, record: Record, cost: float | None, model: str | None,
        bodies: tuple[str, str | None, str | None], chain: str | None = None
        ) -> tuple[Any, ...]:
    """One request's row, in `COLUMNS`' order (a plain tuple: the writer makes one per
    request, on the same core as the requests): `at` when it ended (its `time` is when it
    arrived), `bodies` its payload's state and its bodies as kept, `chain` its attempts as
    JSON if already encoded (pure)."""
    usage, resumes, guardrails = record.usage, record.resumes, record.guardrails
    return (
        at - record.duration, record.request_id, record.key_id, record.team, record.endpoint,
        record.model, record.alias if record.known_model else None, model, record.provider,
        record.stream, chain or msgspec.json.encode(attempts(record)).decode(),
        record.hedged, record.hedge_won, record.cache_hit, record.replayed,
        resumes.ok if resumes is not None else 0,
        msgspec.json.encode(guardrails).decode() if guardrails else "[]",
        _ms(record.ttft), record.duration * 1000, _ms(record.overhead),
        *((usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
           usage.cache_write_tokens) if usage is not None else NO_TOKENS),
        cost, status_of(record), record.error_code,
        record.outcome.value if record.outcome is not None else "unknown", *bodies)


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


def _payload(bodies: object, settings: LogsConfig) -> tuple[str, None, None]:
    """The payload's state of a row that keeps no bodies (`bodies`: the record's)."""
    if isinstance(bodies, str):
        return bodies, None, None
    # Refused before the capture stage decided.
    return (NOT_CAPTURED if settings.capture == "bodies" else DISABLED), None, None


def _stored(bodies: Bodies, most: int, redactor: Redactor) -> tuple[str, str, str | None]:
    """The bodies as stored: redacted, then cut to `most` bytes."""
    request = f"[multipart upload: {bodies.uploaded} bytes, not kept]" if bodies.uploaded \
        else rendered(bodies.request, most, redactor)
    answer = "".join(bodies.text) if bodies.text else bodies.answer.decode("utf-8", "replace")
    return STORED, request, rendered(answer, most, redactor) if answer else None


def rendered(data: bytes | str, most: int, redactor: Redactor) -> str:
    """Content as stored: secrets and key-shaped tokens removed, then cut to `most` bytes at
    a character's end (the margin read past the cut keeps a secret from being cut in two)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    cleaned = redactor.text(mask_credentials(text)).encode()
    return cleaned[:most].decode("utf-8", "ignore")


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None
