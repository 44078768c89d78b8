"""Files, batches and batch requests in the accounts database: every query the routes and the
runner make, each in one transaction; a database failure leaves as `DatabaseUnavailable`.

Every read and change a client asks for names its owner: another key's file or batch is not
found, never shown.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.accounts.statements import transaction
from gateway.batches import jsonl
from gateway.batches.tables import batches, files, requests

PENDING, COMPLETED, FAILED = "pending", "completed", "failed"
# A batch's statuses: those whose requests may still start, and those that are over.
RUNNING = ("validating", "in_progress")
OVER = ("completed", "failed", "expired", "cancelled")
_META = [c for c in files.c if c.name != "content"]


def new_id(prefix: str) -> str:
    """A new id in OpenAI's spelling (`file-…`, `batch_…`)."""
    return f"{prefix}{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class Held:
    """A batch request a process holds to run: where it goes and as whose."""

    batch_id: str
    line: int
    custom_id: str
    url: str
    body: bytes
    owner: str
    tries: int = 0  # failures it was already retried after


class Store:
    """The batches' tables, over the accounts database's engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    def _tx(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return transaction(self.engine, "batches")

    # --- files ------------------------------------------------------------------------------

    async def add_file(self, row: Mapping[str, Any]) -> None:
        async with self._tx() as conn:
            await conn.execute(files.insert().values(**row))

    async def file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        """A file's row without its content; None if it is not this owner's."""
        async with self._tx() as conn:
            found = (await conn.execute(sa.select(*_META).where(
                files.c.id == file_id, files.c.owner == owner))).mappings().first()
        return dict(found) if found is not None else None

    async def content(self, file_id: str, owner: str) -> bytes | None:
        async with self._tx() as conn:
            found = (await conn.execute(sa.select(files.c.content).where(
                files.c.id == file_id, files.c.owner == owner))).scalar_one_or_none()
        return bytes(found) if found is not None else None

    async def files(self, owner: str, purpose: str | None, after: str | None, limit: int,
                    newest_first: bool) -> list[dict[str, Any]]:
        """Up to `limit` + 1 of the owner's files, past the one named `after`."""
        query = sa.select(*_META).where(files.c.owner == owner)
        if purpose is not None:
            query = query.where(files.c.purpose == purpose)
        order = (files.c.created_at.desc(), files.c.id.desc()) if newest_first \
            else (files.c.created_at, files.c.id)
        async with self._tx() as conn:
            if after is not None:
                query = _after(query, await _cursor(conn, files, after, owner), files,
                               newest_first)
            rows = await conn.execute(query.order_by(*order).limit(limit + 1))
            return [dict(r) for r in rows.mappings().all()]

    async def delete_file(self, file_id: str, owner: str) -> bool:
        async with self._tx() as conn:
            done = await conn.execute(files.delete().where(files.c.id == file_id,
                                                           files.c.owner == owner))
            return bool(done.rowcount)

    # --- batches ----------------------------------------------------------------------------

    async def add_batch(self, row: Mapping[str, Any], lines: Sequence[jsonl.Request]) -> None:
        """A batch and its requests, all pending, in one transaction."""
        async with self._tx() as conn:
            await conn.execute(batches.insert().values(**row))
            if lines:
                await conn.execute(requests.insert(), [
                    {"batch_id": row["id"], "line": r.line, "custom_id": r.custom_id,
                     "body": r.body, "state": PENDING, "tries": 0} for r in lines])

    async def batch(self, batch_id: str, owner: str) -> dict[str, Any] | None:
        async with self._tx() as conn:
            found = (await conn.execute(sa.select(batches).where(
                batches.c.id == batch_id, batches.c.owner == owner))).mappings().first()
        return dict(found) if found is not None else None

    async def batch_row(self, batch_id: str) -> dict[str, Any] | None:
        """A batch whoever owns it (the runner's)."""
        async with self._tx() as conn:
            found = (await conn.execute(sa.select(batches).where(batches.c.id == batch_id))
                     ).mappings().first()
        return dict(found) if found is not None else None

    async def batches(self, owner: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Up to `limit` + 1 of the owner's batches, newest first, past the one named `after`."""
        query = sa.select(batches).where(batches.c.owner == owner)
        async with self._tx() as conn:
            if after is not None:
                query = _after(query, await _cursor(conn, batches, after, owner), batches, True)
            rows = await conn.execute(query.order_by(batches.c.created_at.desc(),
                                                     batches.c.id.desc()).limit(limit + 1))
            return [dict(r) for r in rows.mappings().all()]

    async def update_batch(self, batch_id: str, changes: Mapping[str, Any],
                           was: str | None = None) -> bool:
        """Change a batch (only while its status is `was`, when given); whether it changed:
        of several processes moving it on at once, one does."""
        query = batches.update().where(batches.c.id == batch_id)
        if was is not None:
            query = query.where(batches.c.status == was)
        async with self._tx() as conn:
            return bool((await conn.execute(query.values(**changes))).rowcount)

    async def cancel(self, batch_id: str, owner: str, now: float) -> dict[str, Any] | None:
        """Move a running batch to `cancelling` (one that is over stays as it is); the batch,
        or None if it is not this owner's."""
        async with self._tx() as conn:
            await conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.owner == owner,
                batches.c.status.in_(RUNNING)).values(status="cancelling", cancelling_at=now))
            found = (await conn.execute(sa.select(batches).where(
                batches.c.id == batch_id, batches.c.owner == owner))).mappings().first()
        return dict(found) if found is not None else None

    async def counts(self, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per batch: its requests completed and failed so far, and the tokens they used."""
        found = {b: {COMPLETED: 0, FAILED: 0, "input_tokens": 0, "output_tokens": 0}
                 for b in batch_ids}
        if not batch_ids:
            return found
        async with self._tx() as conn:
            rows = await conn.execute(
                sa.select(requests.c.batch_id, requests.c.state, sa.func.count(),
                          sa.func.coalesce(sa.func.sum(requests.c.input_tokens), 0),
                          sa.func.coalesce(sa.func.sum(requests.c.output_tokens), 0))
                .where(requests.c.batch_id.in_(batch_ids), requests.c.state != PENDING)
                .group_by(requests.c.batch_id, requests.c.state))
            for batch_id, state, count, prompt, completion in rows:
                counted = found[batch_id]
                counted[state] = int(count)
                counted["input_tokens"] += int(prompt)
                counted["output_tokens"] += int(completion)
        return found

    # --- the runner's ------------------------------------------------------------------------

    async def active(self) -> bool:
        """Whether any batch run here is not over: else the runner has nothing to do (one
        read, no write, while the gateway has no batch)."""
        async with self._tx() as conn:
            found = await conn.execute(sa.select(batches.c.id).where(
                batches.c.status.not_in(OVER), batches.c.provider.is_(None)).limit(1))
            return found.first() is not None

    async def start_validated(self, now: float) -> None:
        """Batches created since the last look begin."""
        async with self._tx() as conn:
            await conn.execute(batches.update().where(
                batches.c.status == "validating", batches.c.provider.is_(None))
                .values(status="in_progress", in_progress_at=now))

    async def hold(self, me: str, now: float, lease: float, most: int) -> list[Held]:
        """Up to `most` pending requests of running batches that no process holds, oldest
        batch first, now held by `me` for `lease` seconds."""
        free = sa.or_(requests.c.held_until.is_(None), requests.c.held_until < now)
        async with self._tx() as conn:
            rows = (await conn.execute(
                sa.select(requests.c.batch_id, requests.c.line, requests.c.custom_id,
                          requests.c.body, batches.c.endpoint, batches.c.owner,
                          requests.c.tries)
                .join(batches, batches.c.id == requests.c.batch_id)
                .where(batches.c.status == "in_progress", batches.c.expires_at > now,
                       requests.c.state == PENDING, free)
                .order_by(batches.c.created_at, requests.c.batch_id, requests.c.line)
                .limit(most))).all()
            held = []
            for batch_id, line, custom_id, body, endpoint, owner, tries in rows:
                done = await conn.execute(requests.update().where(
                    requests.c.batch_id == batch_id, requests.c.line == line,
                    requests.c.state == PENDING, free)
                    .values(held_by=me, held_until=now + lease))
                if done.rowcount:
                    held.append(Held(batch_id, line, custom_id, endpoint, bytes(body), owner,
                                     int(tries or 0)))
        return held

    async def renew(self, me: str, until: float) -> None:
        """Every request `me` still runs stays held until `until`."""
        async with self._tx() as conn:
            await conn.execute(requests.update().where(
                requests.c.held_by == me, requests.c.state == PENDING)
                .values(held_until=until))

    async def release(self, batch_id: str, line: int, until: float, failed: bool) -> None:
        """A request that could not run now (the gateway full, every provider down): free
        again at `until`; `failed`: counted as one more failure."""
        async with self._tx() as conn:
            await conn.execute(requests.update().where(
                requests.c.batch_id == batch_id, requests.c.line == line,
                requests.c.state == PENDING).values(
                held_by=None, held_until=until,
                tries=requests.c.tries + (1 if failed else 0)))

    async def finish(self, batch_id: str, line: int, state: str, result: bytes,
                     tokens: tuple[int, int] | None) -> bool:
        """A request's result, kept once: False if another process kept one first."""
        async with self._tx() as conn:
            done = await conn.execute(requests.update().where(
                requests.c.batch_id == batch_id, requests.c.line == line,
                requests.c.state == PENDING).values(
                state=state, result=result, held_by=None, held_until=None,
                input_tokens=tokens[0] if tokens else None,
                output_tokens=tokens[1] if tokens else None))
            return bool(done.rowcount)

    async def endable(self, now: float) -> list[tuple[str, str]]:
        """Batches whose end has come, with the status each ends in: every request done
        (`completed`), cancelled or expired with none still running anywhere."""
        pending = sa.select(requests.c.line).where(requests.c.batch_id == batches.c.id,
                                                   requests.c.state == PENDING)
        running = pending.where(requests.c.held_by.is_not(None),
                                requests.c.held_until >= now)
        async with self._tx() as conn:
            done = (await conn.execute(sa.select(batches.c.id).where(
                batches.c.status.in_(("in_progress", "finalizing")), ~pending.exists()))
                    ).scalars().all()
            cancelled = (await conn.execute(sa.select(batches.c.id).where(
                batches.c.status == "cancelling", ~running.exists()))).scalars().all()
            expired = (await conn.execute(sa.select(batches.c.id).where(
                batches.c.status == "in_progress", batches.c.expires_at <= now,
                ~running.exists()))).scalars().all()
        return ([(b, "completed") for b in done] + [(b, "cancelled") for b in cancelled]
                + [(b, "expired") for b in expired if b not in done])

    async def finalizing(self, batch_id: str, now: float) -> bool:
        """A batch whose requests are all done says so while its files are written."""
        async with self._tx() as conn:
            done = await conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.status == "in_progress")
                .values(status="finalizing", finalizing_at=now))
            return bool(done.rowcount)

    async def results(self, batch_id: str) -> list[dict[str, Any]]:
        async with self._tx() as conn:
            rows = await conn.execute(
                sa.select(requests.c.line, requests.c.custom_id, requests.c.state,
                          requests.c.result, requests.c.input_tokens,
                          requests.c.output_tokens)
                .where(requests.c.batch_id == batch_id).order_by(requests.c.line))
            return [dict(r) for r in rows.mappings().all()]

    async def end(self, batch_id: str, was: Sequence[str], changes: Mapping[str, Any],
                  made: Sequence[Mapping[str, Any]]) -> bool:
        """End a batch that is still in one of `was`, with its output and error files, in one
        transaction: False (nothing written) if another process ended it first."""
        async with self._tx() as conn:
            done = await conn.execute(batches.update().where(
                batches.c.id == batch_id, batches.c.status.in_(was)).values(**changes))
            if not done.rowcount:
                return False
            for row in made:
                await conn.execute(files.insert().values(**row))
            return True


async def _cursor(conn: AsyncConnection, table: sa.Table, after: str,
                  owner: str) -> tuple[float, str] | None:
    found = (await conn.execute(sa.select(table.c.created_at, table.c.id).where(
        table.c.id == after, table.c.owner == owner))).first()
    return (float(found[0]), str(found[1])) if found is not None else None


def _after(query: Any, cursor: tuple[float, str] | None, table: sa.Table,
           newest_first: bool) -> Any:
    """Rows after `cursor` in the list's order; an unknown cursor lists nothing past it."""
    if cursor is None:
        return query.where(sa.false())
    at, ident = cursor
    if newest_first:
        return query.where(sa.or_(table.c.created_at < at,
                                  sa.and_(table.c.created_at == at, table.c.id < ident)))
    return query.where(sa.or_(table.c.created_at > at,
                              sa.and_(table.c.created_at == at, table.c.id > ident)))
