"""The accounts database: SQLite by default, PostgreSQL for replicas, through SQLAlchemy's async
engine; its schema moved forward by Alembic at start.

Every change to keys or teams bumps the one `revision` row and writes its audit line in the
same transaction, so a process polling the revision never sees a change without its audit, and
a change is never half made. A database error leaves as `DatabaseUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool

from gateway.accounts.spend import SpendRow
from gateway.accounts.statements import insert
from gateway.accounts.tables import audit, keys, revision, spend, teams
from gateway.core.errors import Conflict, DatabaseUnavailable

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest migration's revision: a database already there is not handed to Alembic, which a
# worker then never imports (tests/test_teams.py checks it against the scripts).
HEAD = "0007"
IN_MEMORY = "sqlite:///:memory:"  # a gateway built without a config file: its own, for its life
DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg",
           "postgres": "postgresql+asyncpg"}
GROUPS = {"key": spend.c.key_id, "team": spend.c.team, "alias": spend.c.alias,
          "provider": spend.c.provider, "day": spend.c.day,
          "model": spend.c.upstream_model}
GroupBy = Literal["key", "team", "alias", "provider", "day", "model"]
# PostgreSQL's advisory lock the migrations run under, so replicas starting together migrate once.
MIGRATION_LOCK = 0x11_5_6A7E
# The audit action after which a gateway with no key in llms.json serves without one again.
REOPENED = "gateway_reopened"
# A spend row with one of these statuses and no provider is a refusal (a key's model, budget or
# limits, the queue full): no provider was asked.
REFUSALS = (403, 429, 503)


class SchemaTooNew(Exception):
    """The database was migrated by a newer gateway than this one."""


def engine_url(url: str) -> str:
    """`sqlite:///PATH` or `postgresql://…` as the async drivers spell them; ValueError for
    anything else."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError("database.url: not a database URL (sqlite:///PATH or "
                         "postgresql://USER@HOST:PORT/DB)") from None
    backend = parsed.drivername.partition("+")[0]
    if backend not in DRIVERS:
        raise ValueError(f"database.url: '{backend}' is not supported (sqlite or postgresql)")
    return parsed.set(drivername=DRIVERS[backend]).render_as_string(hide_password=False)


class Database:
    """The accounts database of one process: its engine, migrations, and every query."""

    def __init__(self, url: str) -> None:
        self.url = engine_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        options: dict[str, Any] = {}
        if self.is_sqlite:
            options["connect_args"] = {"timeout": 5}
            path = make_url(self.url).database
            if path in (None, "", ":memory:"):
                options["poolclass"] = StaticPool  # one connection, or the tables vanish
            else:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
        else:
            options.update(pool_size=5, max_overflow=5, pool_pre_ping=True, pool_timeout=5,
                           connect_args={"timeout": 5, "command_timeout": 10})
        self.engine: AsyncEngine = create_async_engine(self.url, **options)
        self._insert_spend = insert("spend", SpendRow._fields, self.engine.dialect.paramstyle)
        if self.is_sqlite:
            sa.event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)

    async def close(self) -> None:
        await self.engine.dispose()

    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[AsyncConnection]:
        """A transaction; any database failure leaves as `DatabaseUnavailable`."""
        try:
            async with self.engine.begin() as conn:
                yield conn
        except IntegrityError:
            raise
        except (DBAPIError, SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(f"The accounts database is unavailable "
                                      f"({type(exc).__name__})") from exc

    def migrate_now(self) -> None:
        """`migrate` from synchronous code (the CLI, before the workers start)."""
        asyncio.run(self._migrate_and_close())

    async def _migrate_and_close(self) -> None:
        try:
            await self.migrate()
        finally:
            await self.close()

    async def migrate(self) -> None:
        """Bring the schema to this gateway's head; SchemaTooNew if the database is ahead."""
        async with self.engine.begin() as conn:
            if not self.is_sqlite:
                await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"),
                                   {"id": MIGRATION_LOCK})
            if await conn.run_sync(_revision) != HEAD:
                await conn.run_sync(_upgrade)

    # --- the directory's reads -------------------------------------------------------------

    async def revision(self) -> int:
        async with self._tx() as conn:
            return int((await conn.execute(sa.select(revision.c.value))).scalar_one())

    async def directory(self) -> tuple[int, bool, list[dict[str, Any]], list[dict[str, Any]]]:
        """The revision, whether a key was made since the gateway was last reopened (or ever),
        every key not revoked, and every team, read in one transaction."""
        async with self._tx() as conn:
            value = (await conn.execute(sa.select(revision.c.value))).scalar_one()
            opened = sa.select(sa.func.coalesce(sa.func.max(audit.c.time), 0.0)).where(
                audit.c.action == REOPENED).scalar_subquery()
            made = (await conn.execute(sa.select(sa.func.count()).select_from(keys).where(
                keys.c.created_at > opened))).scalar_one()
            key_rows = (await conn.execute(
                sa.select(keys).where(keys.c.revoked_at.is_(None)))).mappings().all()
            team_rows = (await conn.execute(sa.select(teams))).mappings().all()
        return (int(value), made > 0, [dict(r) for r in key_rows],
                [dict(r) for r in team_rows])

    async def spent(self, scopes: Iterable[tuple[str, str, float]]) -> dict[tuple[str, float],
                                                                             float]:
        """Dollars spent by each (kind, name) since its start, keyed by (scope id, start)."""
        wanted: dict[tuple[str, float], list[str]] = {}
        for kind, name, start in scopes:
            wanted.setdefault((kind, start), []).append(name)
        found: dict[tuple[str, float], float] = {}
        async with self._tx() as conn:
            for (kind, start), names in wanted.items():
                column = spend.c.key_id if kind == "key" else spend.c.team
                rows = await conn.execute(
                    sa.select(column, sa.func.sum(spend.c.cost))
                    .where(spend.c.time >= start, column.in_(names)).group_by(column))
                for name, total in rows:
                    found[(f"{kind}:{name}", start)] = float(total or 0.0)
        return found

    # --- keys and teams (each change: its audit line and a new revision) -------------------

    async def _changed(self, conn: AsyncConnection, actor: str, action: str, target: str,
                       change: Mapping[str, Any] | None) -> None:
        await conn.execute(revision.update().values(value=revision.c.value + 1))
        await conn.execute(audit.insert().values(time=time.time(), actor=actor, action=action,
                                                 target=target, change=dict(change or {})))

    async def add_key(self, row: Mapping[str, Any], actor: str,
                      shown: Mapping[str, Any]) -> None:
        """Insert a key (its hash, never its secret); Conflict if its team does not exist."""
        async with self._tx() as conn:
            if row.get("team") is not None:
                await self._team_must_exist(conn, row["team"])
            await conn.execute(keys.insert().values(**row))
            await self._changed(conn, actor, "key_created", row["id"], shown)

    async def reopen(self, actor: str) -> int:
        """Revoke every live key and let the gateway serve without one again, audited as
        `gateway_reopened`; how many keys were revoked."""
        async with self._tx() as conn:
            done = await conn.execute(keys.update().where(keys.c.revoked_at.is_(None))
                                      .values(revoked_at=time.time(), updated_at=time.time()))
            await self._changed(conn, actor, REOPENED, "gateway", {"revoked": done.rowcount})
        return int(done.rowcount)

    async def _team_must_exist(self, conn: AsyncConnection, name: str) -> None:
        found = await conn.execute(sa.select(teams.c.name).where(teams.c.name == name))
        if found.first() is None:
            raise Conflict(f"No team named '{name}'", param="team")

    async def key(self, key_id: str) -> dict[str, Any] | None:
        async with self._tx() as conn:
            row = (await conn.execute(sa.select(keys).where(keys.c.id == key_id))).mappings()
            found = row.first()
        return dict(found) if found is not None else None

    async def keys(self, team: str | None = None) -> list[dict[str, Any]]:
        query = sa.select(keys).order_by(keys.c.created_at)
        if team is not None:
            query = query.where(keys.c.team == team)
        async with self._tx() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings().all()]

    async def update_key(self, key_id: str, changes: Mapping[str, Any], actor: str,
                         action: str = "key_updated") -> dict[str, Any] | None:
        """Change a key that is not revoked; None if there is no such key."""
        async with self._tx() as conn:
            if changes.get("team") is not None:
                await self._team_must_exist(conn, changes["team"])
            done = await conn.execute(
                keys.update().where(keys.c.id == key_id, keys.c.revoked_at.is_(None))
                .values(**changes, updated_at=time.time()))
            if done.rowcount == 0:
                return None
            await self._changed(conn, actor, action, key_id, _shown(changes))
            row = (await conn.execute(sa.select(keys).where(keys.c.id == key_id))).mappings()
            return dict(row.one())

    async def add_team(self, row: Mapping[str, Any], actor: str) -> None:
        try:
            async with self._tx() as conn:
                await conn.execute(teams.insert().values(**row))
                await self._changed(conn, actor, "team_created", row["name"], _shown(row))
        except IntegrityError:
            raise Conflict(f"A team named '{row['name']}' exists", param="name") from None

    async def teams(self) -> list[dict[str, Any]]:
        async with self._tx() as conn:
            rows = await conn.execute(sa.select(teams).order_by(teams.c.name))
            return [dict(r) for r in rows.mappings().all()]

    async def update_team(self, name: str, changes: Mapping[str, Any], actor: str
                          ) -> dict[str, Any] | None:
        async with self._tx() as conn:
            done = await conn.execute(teams.update().where(teams.c.name == name)
                                      .values(**changes, updated_at=time.time()))
            if done.rowcount == 0:
                return None
            await self._changed(conn, actor, "team_updated", name, _shown(changes))
            row = (await conn.execute(sa.select(teams).where(teams.c.name == name))).mappings()
            return dict(row.one())

    async def delete_team(self, name: str, actor: str) -> bool:
        """Delete a team with no live key (Conflict while it has one); False if none."""
        async with self._tx() as conn:
            live = await conn.execute(sa.select(sa.func.count()).select_from(keys).where(
                keys.c.team == name, keys.c.revoked_at.is_(None)))
            if (count := live.scalar_one()) > 0:
                raise Conflict(f"Team '{name}' still has {count} key(s): revoke or move them "
                               "first")
            done = await conn.execute(teams.delete().where(teams.c.name == name))
            if done.rowcount == 0:
                return False
            await self._changed(conn, actor, "team_deleted", name, None)
            return True

    async def audited(self, actor: str, action: str, target: str,
                      change: Mapping[str, Any] | None = None) -> None:
        """An admin action that is not a key or team change (a provider disabled, a reload)."""
        async with self._tx() as conn:
            await conn.execute(audit.insert().values(time=time.time(), actor=actor,
                                                     action=action, target=target,
                                                     change=dict(change or {})))

    async def audit_log(self, start: float | None, end: float | None, limit: int
                        ) -> list[dict[str, Any]]:
        query = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
        if start is not None:
            query = query.where(audit.c.time >= start)
        if end is not None:
            query = query.where(audit.c.time < end)
        async with self._tx() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings().all()]

    # --- spend ---------------------------------------------------------------------------------

    async def write_spend(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert a batch of spend rows (tuples in `SpendRow`'s order) in one statement, handed to
        the driver as they are (the per-row work of a compiled insert costs more than the
        request that made the row)."""
        if rows:
            async with self._tx() as conn:
                await conn.exec_driver_sql(self._insert_spend, list(rows))

    async def spend_report(self, group_by: GroupBy, start: float | None, end: float | None,
                           teams: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Requests, requests the gateway refused before any provider (a spent budget, a
        limit, a model not allowed: nothing was spent), tokens and dollars per group over
        [start, end), of `teams` only when given."""
        column = GROUPS[group_by]
        refused = sa.and_(spend.c.status.in_(REFUSALS), spend.c.provider.is_(None))
        query = sa.select(column.label("group"), sa.func.count().filter(sa.not_(refused)),
                          sa.func.count().filter(refused),
                          sa.func.coalesce(sa.func.sum(spend.c.prompt_tokens), 0),
                          sa.func.coalesce(sa.func.sum(spend.c.completion_tokens), 0),
                          sa.func.coalesce(sa.func.sum(spend.c.cached_tokens), 0),
                          sa.func.coalesce(sa.func.sum(spend.c.cost), 0.0)
                          ).group_by(column).order_by(column)
        if start is not None:
            query = query.where(spend.c.time >= start)
        if end is not None:
            query = query.where(spend.c.time < end)
        if teams is not None:  # a team admin's: their teams' rows only
            query = query.where(spend.c.team.in_(teams))
        async with self._tx() as conn:
            rows = (await conn.execute(query)).all()
        return [{"group": group, "requests": int(requests), "refused": int(refused),
                 "prompt_tokens": int(prompt), "completion_tokens": int(completion),
                 "cached_tokens": int(cached), "cost": round(float(cost), 9)}
                for group, requests, refused, prompt, completion, cached, cost in rows]

    async def spend_since(self, starts: Mapping[str, float], top_since: float, top: int
                          ) -> tuple[dict[str, tuple[int, float]], list[dict[str, Any]]]:
        """Requests and dollars since each named start, and the `top` keys by dollars since
        `top_since` (with their names when they are virtual keys), in one transaction."""
        totals: dict[str, tuple[int, float]] = {}
        cost = sa.func.coalesce(sa.func.sum(spend.c.cost), 0.0)
        async with self._tx() as conn:
            for name, start in starts.items():
                count, dollars = (await conn.execute(
                    sa.select(sa.func.count(), cost).where(spend.c.time >= start))).one()
                totals[name] = (int(count), float(dollars))
            rows = (await conn.execute(
                sa.select(spend.c.key_id, keys.c.name, sa.func.count(), cost.label("cost"))
                .select_from(spend.outerjoin(keys, keys.c.id == spend.c.key_id))
                .where(spend.c.time >= top_since, spend.c.key_id.is_not(None))
                .group_by(spend.c.key_id, keys.c.name)
                .order_by(sa.desc("cost"), spend.c.key_id).limit(top))).all()
        return totals, [{"key": key_id, "name": name, "requests": int(count),
                         "cost": round(float(dollars), 9)}
                        for key_id, name, count, dollars in rows]

    async def prune_spend(self, before: float) -> int:
        """Delete spend rows older than `before` (the retention); how many went."""
        async with self._tx() as conn:
            done = await conn.execute(spend.delete().where(spend.c.time < before))
            return int(done.rowcount or 0)


def _shown(changes: Mapping[str, Any]) -> dict[str, Any]:
    """What an audit line keeps of a change: never a key's hash."""
    return {k: v for k, v in changes.items() if k not in ("hash",)}


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # WAL: readers (the directory's poll) never wait on the spend writer; a busy database is
    # waited on, not failed at once, when several processes share the file. A batch insert's
    # statement journal (its undo record) stays in memory rather than spilling to a temp file.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA temp_store=MEMORY")
    cursor.close()


def _revision(connection: Connection) -> str | None:
    """The schema revision Alembic last wrote, read without Alembic."""
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    found = connection.execute(sa.text("SELECT version_num FROM alembic_version")).first()
    return str(found[0]) if found is not None else None


def _upgrade(connection: Connection) -> None:
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    script = ScriptDirectory.from_config(config)
    current = MigrationContext.configure(connection).get_current_revision()
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            raise SchemaTooNew(
                f"the accounts database is at schema revision {current}, newer than this "
                f"gateway's ({script.get_current_head()}): run a gateway at least as new, or "
                "point database.url at another database") from None
    command.upgrade(config, "head")
