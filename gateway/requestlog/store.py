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
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.accounts.statements import insert, transaction
from gateway.requestlog.tables import request_log

COLUMNS = tuple(c.name for c in request_log.c if c.name != "id")
BODIES = ("request_body", "response_body")
# What a listed row shows: everything but its bodies (`/admin/logs/{request_id}` has them).
LISTED = [c for c in request_log.c if c.name not in BODIES]
PURGE_BATCH = 5_000  # rows deleted per transaction
# Rows one SQLite insert statement carries: their parameters stay under 999, the oldest
# SQLite's limit. A statement per row would bind as many values, but run the table's
# AUTOINCREMENT bookkeeping and the statement's setup once per row.
ROWS_PER_INSERT = 32


@dataclass(frozen=True, slots=True)
class Spelling:
    """What a row holds for NULL in its nullable columns, and for false and true, as its
    database's driver binds them cheapest."""

    null: Any
    flags: tuple[Any, Any]  # (false, true)


PLAIN = Spelling(None, (False, True))  # asyncpg takes only these for NULL and booleans
# sqlite3 adapts every None and bool it binds (a registry lookup and a call each: most of a
# row's binding). It binds a NaN as a double, which SQLite stores as NULL (as it always stored
# a NaN), and 0 and 1 as integers, which SQLite stored for a bool anyway: the same row, read
# back the same.
SQLITE = Spelling(math.nan, (0, 1))


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
        self.spelling = SQLITE if self._sqlite else PLAIN  # how `Journal` spells its rows
        if self._sqlite:
            plain_binds()

    def _tx(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return transaction(self.engine, "request log's")

    async def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert rows (tuples in `COLUMNS`' order) in one transaction, in order, handed to
        the driver as they are (on SQLite, `ROWS_PER_INSERT` rows a statement)."""
        if not rows:
            return
        async with self._tx() as conn:
            if not self._sqlite:
                await conn.exec_driver_sql(self._insert, list(rows))
                return
            whole = len(rows) - len(rows) % ROWS_PER_INSERT
            if whole:
                await conn.exec_driver_sql(_values(ROWS_PER_INSERT), [
                    tuple(chain.from_iterable(rows[start:start + ROWS_PER_INSERT]))
                    for start in range(0, whole, ROWS_PER_INSERT)])
            if whole < len(rows):
                await conn.exec_driver_sql(_values(len(rows) - whole),
                                           tuple(chain.from_iterable(rows[whole:])))

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
