"""The console's sessions, kept in the accounts database so that every worker and replica sees
a sign-in and a sign-out at once (`gateway.console` opens them, `gateway.edge.access` reads
them).

The browser holds a random token in a cookie; the database holds its SHA-256 only, so a copy of
the database signs no one in. A session is refused once ended or past its expiry.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import Sequence
from typing import Literal

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.accounts.database import Database
from gateway.accounts.statements import transaction
from gateway.accounts.tables import console_sessions

Role = Literal["admin", "viewer", "team_admin"]
# A session table never grows past this: the oldest ended or expired rows go first.
PRUNE_EVERY = 100


class Session(msgspec.Struct, frozen=True):
    """Who signed in, as what, until when; `csrf` must come with every write."""

    actor: str
    role: Role
    teams: tuple[str, ...]
    csrf: str
    via: str
    expires_at: float


def _hashed(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Sessions:
    """Open, find and end console sessions in one accounts database."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._opened = 0

    def _tx(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        return transaction(self._db.engine, "accounts")

    async def open(self, actor: str, role: Role, teams: Sequence[str], via: str,
                   lifetime: float) -> tuple[str, Session]:
        """A new session: the token for the cookie (shown once, kept nowhere) and the row."""
        token, now = secrets.token_urlsafe(32), time.time()
        session = Session(actor[:128], role, tuple(teams), secrets.token_urlsafe(24), via,
                          now + lifetime)
        async with self._tx() as conn:
            await conn.execute(console_sessions.insert().values(
                id=_hashed(token), actor=session.actor, role=role, teams=list(teams),
                csrf=session.csrf, via=via, created_at=now, expires_at=session.expires_at))
        self._opened += 1
        if self._opened % PRUNE_EVERY == 0:
            await self.prune(now)
        return token, session

    async def find(self, token: str) -> Session | None:
        """The live session of `token`, or None (unknown, ended or expired)."""
        if not token or len(token) > 128:
            return None
        async with self._tx() as conn:
            row = (await conn.execute(sa.select(console_sessions).where(
                console_sessions.c.id == _hashed(token),
                console_sessions.c.ended_at.is_(None),
                console_sessions.c.expires_at > time.time()))).mappings().first()
        if row is None:
            return None
        return Session(row["actor"], row["role"], tuple(row["teams"] or ()), row["csrf"],
                       row["via"], row["expires_at"])

    async def end(self, token: str) -> None:
        """Sign out: the session is refused from now on, by every process."""
        async with self._tx() as conn:
            await conn.execute(console_sessions.update().where(
                console_sessions.c.id == _hashed(token)).values(ended_at=time.time()))

    async def prune(self, now: float) -> int:
        """Delete sessions that can no longer be used (expired, or ended a day ago)."""
        async with self._tx() as conn:
            done = await conn.execute(console_sessions.delete().where(sa.or_(
                console_sessions.c.expires_at < now,
                console_sessions.c.ended_at < now - 86_400)))
            return int(done.rowcount or 0)
