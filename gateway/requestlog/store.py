"""The request log's queries over the accounts database's engine: write a batch, find rows by
filters a page at a time, find one request, purge by age and by rows.

Pages are keyset pages, newest first, on (time, id): a page's cursor is where the next one
starts, so a page costs the same however deep it is. Purges delete by ranges of ids, a
transaction per range, so neither this process nor the database holds more than one range at a
time, however many rows go. A database failure leaves as `DatabaseUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.accounts.statements import insert, transaction
from gateway.core.errors import DatabaseUnavailable
from gateway.requestlog.tables import request_log

COLUMNS = tuple(c.name for c in request_log.c if c.name != "id")
BODIES = ("request_body", "response_body")
# What a listed row shows: everything but its bodies (`/admin/logs/{request_id}` has them).
LISTED = [c for c in request_log.c if c.name not in BODIES]
PURGE_BATCH = 5_000  # rows deleted per transaction
# Rows one SQLite insert statement carries (a page of `journal.Journal`'s buffer): their
# parameters stay under 999, the oldest SQLite's limit. A statement per row would bind as many
# values, but run the statement's setup once per row.
PAGE_ROWS = 32
WIDTH = len(COLUMNS)
# On SQLite a full page's statement spells as literals the values all its rows share in these
# columns (a handful of values each: binding a value costs more than inserting it), and NULL in
# any column all its rows leave empty; it is made once per set of such values (`MAX_SHAPES`
# kept: sqlite3 keeps 128 statements prepared per connection).
SHARED = tuple(COLUMNS.index(name) for name in (
    "key_id", "team", "endpoint", "requested", "alias", "model", "provider", "stream",
    "attempts", "hedged", "hedge_won", "cache_hit", "replayed", "resumed", "guardrails",
    "status", "error_code", "outcome", "payload"))
NULLABLE = tuple(COLUMNS.index(name) for name in (
    "ttft_ms", "overhead_ms", "prompt_tokens", "completion_tokens", "cached_tokens",
    "cache_write_tokens", "cost", "request_body", "response_body"))
MAX_SHAPES = 64
# A page a flush writes before it is full goes in chunks of these sizes; one of 8 rows or more
# is shaped too (a smaller one's shape would often be its rows' own, a statement each).
CHUNKS = (32, 16, 8, 4, 2, 1)
SHAPED_ROWS = 8
MAX_LITERAL = 256  # characters: a longer text is bound


@dataclass(frozen=True, slots=True)
class Filters:
    """What `/admin/logs` narrows rows to; None: any."""

    key: str | None = None
    team: str | None = None
    alias: str | None = None
    model: str | None = None
    provider: str | None = None
    status: int | None = None
    since: float | None = None
    until: float | None = None
    q: str | None = None  # text in the captured bodies
    teams: tuple[str, ...] | None = None  # only rows of these teams (a team admin's)


class Store:
    """The request log's table, over the accounts database's engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._insert = insert("request_log", COLUMNS, engine.dialect.paramstyle)
        self._sqlite = engine.dialect.name == "sqlite"
        # A full page's statement and the columns it binds, by the values its rows share.
        self._shapes: dict[tuple[Any, ...], tuple[str, tuple[int, ...]]] = {}
        if self._sqlite:
            plain_binds()

    def _tx(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return transaction(self.engine, "request log's")

    async def write(self, pages: Sequence[list[Any]]) -> None:
        """Insert pages of rows (each a flat list, `WIDTH` values a row in `COLUMNS`' order)
        in one transaction, in order, handed to the driver as they are (on SQLite, a statement
        a page, consecutive pages of one statement in one call)."""
        if not pages:
            return
        async with self._tx() as conn:
            if not self._sqlite:
                await conn.exec_driver_sql(self._insert, [
                    row for page in pages for row in zip(*[iter(page)] * WIDTH, strict=True)])
                return
            # aiosqlite's connection itself, in SQLAlchemy's transaction: a call per statement,
            # where `exec_driver_sql` adds an execution context and three trips to the driver's
            # thread (a cursor made, used, closed), the most of a flush of a few rows.
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None  # checked out: not yet closed
            statements = [made for page in pages for made in self._statements(page)]
            try:
                for sql, params in _grouped(statements):
                    await driver.executemany(sql, params)
            except sqlite3.Error as exc:
                raise DatabaseUnavailable(f"The request log's database is unavailable "
                                          f"({type(exc).__name__})") from exc

    def _statements(self, page: list[Any]) -> list[tuple[str, tuple[Any, ...]]]:
        """SQLite's inserts of `page`'s rows and their parameters: its rows in chunks of
        `CHUNKS` rows (a handful of statements, each prepared once), a chunk of
        `SHAPED_ROWS` or more with the values its rows share spelled in."""
        rows = len(page) // WIDTH
        if rows == PAGE_ROWS:
            return [self._statement(page, rows)]
        made, start = [], 0
        for size in CHUNKS:
            while rows - start >= size:
                made.append(self._statement(page[start * WIDTH:(start + size) * WIDTH], size))
                start += size
        return made

    def _statement(self, chunk: list[Any], count: int) -> tuple[str, tuple[Any, ...]]:
        """The insert of `count` rows, `chunk`, and its parameters (`SHARED`, `NULLABLE`)."""
        if count < SHAPED_ROWS:
            return _values(count), tuple(chunk)
        shape: list[Any] = [count]
        for column in SHARED:
            values = chunk[column::WIDTH]
            if values.count(first := values[0]) == count:
                shape += (column, first)
        for column in NULLABLE:
            if chunk[column] is None and chunk[column::WIDTH].count(None) == count:
                shape += (column, None)
        key = tuple(shape)
        try:
            sql, bound = self._shapes[key]
        except KeyError:
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
            shared = dict(zip(shape[1::2], shape[2::2], strict=True))
            sql, bound = self._shapes[key] = _shaped(shared, count)
        step = len(bound)
        params: list[Any] = [None] * (step * count)
        for at, column in enumerate(bound):
            params[at::step] = chunk[column::WIDTH]
        return sql, tuple(params)

    async def page(self, filters: Filters, limit: int, after: tuple[float, int] | None
                   ) -> list[dict[str, Any]]:
        """Up to `limit` rows matching `filters`, newest first, from after the (time, id) of
        the last row of the previous page; bodies left out."""
        query = _where(sa.select(*LISTED), filters)
        if after is not None:
            at, row_id = after
            query = query.where(sa.or_(request_log.c.time < at, sa.and_(
                request_log.c.time == at, request_log.c.id < row_id)))
        query = query.order_by(request_log.c.time.desc(), request_log.c.id.desc()).limit(limit)
        async with self._tx() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings().all()]

    async def one(self, request_id: str) -> dict[str, Any] | None:
        """The newest row of the request `request_id` (a client may send an id twice)."""
        query = sa.select(request_log).where(request_log.c.request_id == request_id) \
            .order_by(request_log.c.id.desc()).limit(1)
        async with self._tx() as conn:
            found = (await conn.execute(query)).mappings().first()
        return dict(found) if found is not None else None

    async def purge(self, before: float, max_rows: int, batch: int = PURGE_BATCH) -> int:
        """Delete the rows older than `before`, then the oldest past the newest `max_rows`, a
        range of `batch` ids per transaction (the loop is given a turn between two); how
        many went."""
        table = request_log
        async with self._tx() as conn:
            lowest, old = (await conn.execute(sa.select(
                sa.select(sa.func.min(table.c.id)).scalar_subquery(),
                sa.select(sa.func.max(table.c.id)).where(table.c.time < before)
                .scalar_subquery()))).one()
        deleted = await self._ranges(lowest, old, batch, table.c.time < before)
        async with self._tx() as conn:
            count = (await conn.execute(sa.select(sa.func.count()).select_from(table))
                     ).scalar_one()
            last = None
            if count > max_rows:
                last = (await conn.execute(sa.select(table.c.id).order_by(table.c.id)
                                           .offset(count - max_rows - 1).limit(1))).scalar()
                lowest = (await conn.execute(sa.select(sa.func.min(table.c.id)))).scalar()
        return deleted + await self._ranges(lowest, last, batch, sa.true())

    async def _ranges(self, lowest: int | None, highest: int | None, batch: int,
                      also: sa.ColumnElement[bool]) -> int:
        """Delete the rows with ids in [lowest, highest] that match `also`, `batch` ids a
        transaction."""
        if lowest is None or highest is None:
            return 0
        deleted, start, id_ = 0, lowest, request_log.c.id
        while start <= highest:
            end = min(start + batch, highest + 1)
            async with self._tx() as conn:
                done = await conn.execute(request_log.delete().where(
                    id_ >= start, id_ < end, also))
            deleted += int(done.rowcount or 0)
            start = end
            await asyncio.sleep(0)
        return deleted


def _grouped(statements: list[tuple[str, tuple[Any, ...]]]
             ) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Consecutive statements of the same SQL as one, with their parameters in order."""
    grouped: list[tuple[str, list[tuple[Any, ...]]]] = []
    for sql, params in statements:
        if grouped and grouped[-1][0] == sql:
            grouped[-1][1].append(params)
        else:
            grouped.append((sql, [params]))
    return grouped


def _shaped(shared: dict[int, Any], count: int) -> tuple[str, tuple[int, ...]]:
    """The insert of `count` rows with `shared`'s values (by column) spelled in once where
    SQLite reads them back the same, and the columns it binds (`VALUES`' rows, in order)."""
    spelled = {column: text for column, value in shared.items()
               if (text := _literal(value)) is not None}
    bound = tuple(column for column in range(WIDTH) if column not in spelled)
    one = f"({', '.join('?' * len(bound))})"
    names = ", ".join(COLUMNS[column] for column in (*bound, *spelled))
    values = ", ".join([*(f"column{at}" for at in range(1, len(bound) + 1)),
                        *spelled.values()])
    return (f"INSERT INTO request_log ({names}) SELECT {values} "
            f"FROM (VALUES {', '.join([one] * count)})"), bound


def _literal(value: Any) -> str | None:
    """`value` as an SQL literal that stores what binding it would (None: bind it)."""
    if value is None:
        return "NULL"
    if value.__class__ is bool:
        return "1" if value else "0"
    if value.__class__ is int and -(2 ** 63) <= value < 2 ** 63:
        return str(value)
    if value.__class__ is str and len(value) <= MAX_LITERAL and "\x00" not in value:
        return "'" + value.replace("'", "''") + "'"
    return None


@functools.cache
def _values(rows: int) -> str:
    """SQLite's insert of `rows` rows in one statement (`?` placeholders, rows in order)."""
    one = f"({', '.join('?' * len(COLUMNS))})"
    return f"INSERT INTO request_log ({', '.join(COLUMNS)}) VALUES {', '.join([one] * rows)}"


def plain_binds() -> None:
    """sqlite3 binds None and bools as it always does, NULL and 0 or 1, through an adapter
    registered for their types (process-wide, idempotent).

    Without one, sqlite3 asks each None or bool parameter for its `__conform__` and its
    protocol for `__adapt__`, raising and clearing an AttributeError each time: most of a
    request-log row's insert, which has a dozen of them."""
    sqlite3.register_adapter(type(None), _null)
    sqlite3.register_adapter(bool, int)


def _null(_: None) -> None:
    return None


def _where(query: sa.Select[Any], filters: Filters) -> sa.Select[Any]:
    table = request_log.c
    for column, value in ((table.key_id, filters.key), (table.team, filters.team),
                          (table.alias, filters.alias), (table.provider, filters.provider),
                          (table.status, filters.status)):
        if value is not None:
            query = query.where(column == value)
    if filters.teams is not None:  # a row without a team is no team admin's
        query = query.where(table.team.in_(filters.teams))
    if filters.model is not None:  # the upstream model that served, or the name sent
        query = query.where(sa.or_(table.model == filters.model,
                                   table.requested == filters.model))
    if filters.since is not None:
        query = query.where(table.time >= filters.since)
    if filters.until is not None:
        query = query.where(table.time < filters.until)
    if filters.q is not None:
        query = query.where(sa.or_(table.request_body.icontains(filters.q, autoescape=True),
                                   table.response_body.icontains(filters.q, autoescape=True)))
    return query
