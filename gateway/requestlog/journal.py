"""The request log's listener and writer: a row per request, written off the request path.

When a request's record ends, `Journal.ended` (a listener, `gateway.observe.observers`) makes
its row, plain values in `COLUMNS`' order, and adds them to the page being filled: a flat list
of `PAGE_ROWS` rows, what one insert statement carries (`store.Store.write`). The record itself
is not held, and neither is a row (a second's rows, each a tuple alive until its batch is
written, kept the garbage collector busy). The attempts of a request answered at its first try
are its provider's one JSON text, made once; the upstream model that served is left to the
writer, looked up once a page (by alias and provider, as the spend table's); the bodies a row
keeps are redacted and cut by the writer too. The journal's own
task (`run`) writes the pages once per `database.flush_interval`, as spend rows are. A database
that is down leaves pages buffered (the oldest dropped past `MAX_BUFFERED` rows, counted) and
bodies held up to `MAX_HELD_BYTES` (past it, a row keeps its metadata and says
`not_captured`). The same task purges rows past `logs.retention_days` and `logs.max_rows` every
`logs.purge_interval` seconds, in small batches (`store.Store.purge`).

With no `logs` section in llms.json no row is written: a request the capture stage saw was
made while it was in force, any other asks the live config. A 401 is nobody's request and is
never logged (a flood of them would push real rows out).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.core.errors import DatabaseUnavailable
from gateway.core.record import Outcome, Record
from gateway.core.settings import Route
from gateway.core.settings.logs import LogsConfig
from gateway.observe.observers import status_of
from gateway.requestlog.capture import DISABLED, NOT_CAPTURED, STORED, Bodies
from gateway.requestlog.store import COLUMNS, PAGE_ROWS, WIDTH, Store
from providers.contract.log import get_logger
from providers.contract.redact import Redactor, mask_credentials

UNAUTHENTICATED = 401
MAX_BUFFERED = 50_000  # rows waiting to be written
MAX_HELD_BYTES = 64 * 1024 * 1024  # bodies waiting with them
BATCH_ROWS = 1_000  # rows per transaction
BATCH_BYTES = 8 * 1024 * 1024  # ... and bodies per transaction
MAX_PROVIDERS = 256  # first tries' attempts kept encoded (providers renamed by reloads: a few)
Row = tuple[Any, ...]
NO_USAGE = (None, None, None, None)  # a row's tokens without usage
_ALIAS, _MODEL, _PROVIDER = (COLUMNS.index(name) for name in ("alias", "model", "provider"))
_PAYLOAD, _BODY = COLUMNS.index("payload"), COLUMNS.index("request_body")
# A row's `outcome`, looked up: on 3.11 an enum member's `value` and its hash (a dict's key)
# call Python code, so the usual one is compared by identity first.
_OUTCOMES: dict[Outcome | None, str] = {
    None: "unknown", **{outcome: outcome.value for outcome in Outcome}}
_COMPLETED, _COMPLETED_TEXT = Outcome.COMPLETED, Outcome.COMPLETED.value


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
        # Full pages, oldest first (a page a failed flush put back may be shorter), and the
        # page being filled: rows flattened, `WIDTH` values each.
        self.pages: deque[list[Any]] = deque()
        self.page: list[Any] = []
        self._full = WIDTH * PAGE_ROWS
        self.held = 0  # bytes of bodies in the buffer
        self.dropped = 0  # rows lost to a full buffer while the database was down
        self._purged = 0.0
        # A row's last columns (payload, request_body, response_body) when it keeps no bodies.
        self._payloads: dict[object, tuple[str, None, None]] = {
            state: (state, None, None) for state in (DISABLED, NOT_CAPTURED)}
        # The attempts of a request its provider answered at the first try, by provider.
        self._firsts: dict[str | None, str] = {None: "[]"}

    def ended(self, record: Record) -> None:
        """The record's listener: the request's row added to the buffer (its bodies, if
        kept, with it)."""
        if record.status == UNAUTHENTICATED:
            return
        if (bodies := record.bodies) is None:  # the capture stage did not see it
            if (settings := self.settings()) is None:
                return
            bodies = NOT_CAPTURED if settings.capture == "bodies" else DISABLED
        payload: tuple[Any, Bodies | None, None]
        if bodies.__class__ is str:
            try:
                payload = self._payloads[bodies]
            except KeyError:
                payload = (bodies, None, None)
        elif isinstance(bodies, Bodies) and bodies.held \
                and self.held + bodies.held <= MAX_HELD_BYTES:
            self.held += bodies.held
            payload = (STORED, bodies, None)  # made what is stored when written
        else:
            payload = self._payloads[NOT_CAPTURED]
        chain = None
        if not (record.failed or record.lost or record.hedge_won or record.cache_hit
                or record.replayed or (record.resumes is not None and record.resumes.ok)):
            chain = self._firsts.get(record.provider) or self._first(record)
        page = self.page
        page += row(self.clock(), record, self.cost_of(record), None, payload, chain)
        if len(page) >= self._full:
            self._turn()

    def _first(self, record: Record) -> str:
        """The attempts of a request answered at its first try, kept for its provider's next."""
        if len(self._firsts) >= MAX_PROVIDERS:
            self._firsts = {None: "[]"}
        chain = self._firsts[record.provider] = msgspec.json.encode(attempts(record)).decode()
        return chain

    def _turn(self) -> None:
        """The page being filled is full: a new one; past `MAX_BUFFERED` rows, the oldest
        page dropped."""
        self.pages.append(self.page)
        self.page = []
        while len(self.pages) * PAGE_ROWS > MAX_BUFFERED:
            lost = self.pages.popleft()
            self.held -= _held(lost)
            self.dropped += len(lost) // WIDTH

    async def run(self) -> None:
        """Forever: the buffer written, old rows purged."""
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                await self.flush()
                await self.purge()
            except DatabaseUnavailable as exc:
                get_logger().warning("request_log_unwritten", rows=self.buffered(),
                                     error=str(exc))

    async def flush(self) -> None:
        """Write the buffered rows, a batch at a time; on failure the batch stays, in order."""
        if self.page:
            self._turn()
        pages = self.pages
        while pages:
            batch: list[list[Any]] = []
            rows = size = 0
            while pages and rows < BATCH_ROWS and size < BATCH_BYTES:
                batch.append(page := pages.popleft())
                rows += len(page) // WIDTH
                if self.held:
                    size += _held(page)
            try:
                await self.store.write(self.written(batch, size))
            except BaseException:
                pages.extendleft(reversed(batch))
                raise
            self.held -= size

    def written(self, batch: list[list[Any]], size: int = 0) -> list[list[Any]]:
        """The pages as written: each row's upstream model filled in (in place: the same whenever
        it is written), its bodies, if it kept any, redacted and cut (in copies: a failed write
        keeps them to write again)."""
        found: dict[tuple[Any, Any], Any] = {}  # a batch sees the routes as they are now
        for page in batch:
            aliases, providers = page[_ALIAS::WIDTH], page[_PROVIDER::WIDTH]
            count = len(aliases)
            if aliases.count(aliases[0]) == count and providers.count(providers[0]) == count:
                page[_MODEL::WIDTH] = [self._model(aliases[0], providers[0], found)] * count
            else:
                page[_MODEL::WIDTH] = [self._model(alias, provider, found)
                                       for alias, provider in zip(aliases, providers, strict=True)]
        return [self._stored(page) for page in batch] if size else batch

    def _model(self, alias: Any, provider: Any, found: dict[tuple[Any, Any], Any]) -> Any:
        """The upstream model `provider` serves `alias` with (None for either None)."""
        try:
            return found[alias, provider]
        except KeyError:
            route = None if alias is None or provider is None \
                else self.route_of(alias, provider)
            model = found[alias, provider] = None if route is None else route.upstream_model
            return model

    def _stored(self, page: list[Any]) -> list[Any]:
        """A copy of `page`, each kept body redacted and cut."""
        bodies = page[_BODY::WIDTH]
        if not any(isinstance(kept, Bodies) for kept in bodies):
            return page
        most, redactor = (self.settings() or LogsConfig()).max_body_bytes, self.redactor()
        page = page[:]
        for at, kept in enumerate(bodies):
            if isinstance(kept, Bodies):
                start = at * WIDTH + _PAYLOAD
                page[start:start + 3] = _stored(kept, most, redactor)
        return page

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
            get_logger().warning("request_log_unwritten", rows=self.buffered(),
                                 error=str(exc))

    def buffered(self) -> int:
        """Rows waiting to be written."""
        return (sum(len(page) for page in self.pages) + len(self.page)) // WIDTH

    def status(self) -> dict[str, Any]:
        """What `/status.json` says of the request log: on or off, rows waiting to be written,
        rows lost while the database was down."""
        return {"on": self.settings() is not None, "buffered": self.buffered(),
                "dropped": self.dropped}


def _held(page: list[Any]) -> int:
    """Bytes of the bodies `page` keeps."""
    return sum(kept.held for kept in page[_BODY::WIDTH] if isinstance(kept, Bodies))


def row(at: float, record: Record, cost: float | None, model: str | None,
        bodies: tuple[str, Any, Any], chain: str | None = None) -> Row:
    """One request's row, in `COLUMNS`' order: `at` when it ended (its `time` is when it
    arrived), `bodies` its payload's state and its bodies as kept, `chain` its attempts as
    JSON if already encoded (pure)."""
    usage, resumes, guardrails = record.usage, record.resumes, record.guardrails
    ttft, overhead, duration, outcome = record.ttft, record.overhead, record.duration, \
        record.outcome
    # Milliseconds to the microsecond (`round(x, 3)` formats the float: many times dearer).
    return (
        at - duration, record.request_id, record.key_id, record.team, record.endpoint,
        record.model, record.alias if record.known_model else None, model, record.provider,
        record.stream, chain or msgspec.json.encode(attempts(record)).decode(), record.hedged,
        record.hedge_won, record.cache_hit, record.replayed,
        resumes.ok if resumes is not None else 0,
        msgspec.json.encode(guardrails).decode() if guardrails else "[]",
        None if ttft is None else round(ttft * 1_000_000) / 1000, duration * 1000,
        None if overhead is None else round(overhead * 1_000_000) / 1000,
        *(NO_USAGE if usage is None else (usage.prompt_tokens, usage.completion_tokens,
                                          usage.cached_tokens, usage.cache_write_tokens)),
        cost, status_of(record), record.error_code,
        _COMPLETED_TEXT if outcome is _COMPLETED else _OUTCOMES[outcome], *bodies)


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


def _stored(bodies: Bodies, most: int, redactor: Redactor) -> tuple[str, str, str | None]:
    """The bodies as stored: redacted, then cut to `most` bytes (no answer: None)."""
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

