"""The keys and teams a process knows, in memory: what a request is checked against.

The database is polled for its revision (one small read); when an admin changed something the
whole directory is read again and swapped in one assignment, so a revocation reaches every
worker and replica within the poll interval. A process that may share its database with others
reads it again before it serves a request without a key (`fresh`), so the first key made on any
of them closes every one at once. If the database is down the last directory keeps
serving. With each read comes what every budgeted scope has spent in its current period, the
starting point of a ledger that sees the period for the first time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.accounts.account import Account, account_of, digest, window
from gateway.accounts.database import Database


@dataclass(frozen=True, slots=True)
class Known:
    """One read of the database: its revision, accounts by key hash, teams by name."""

    revision: int = -1
    # A key was made, even if every one is revoked since: then every relay request needs a key
    # (`Accounts.keys_required`; revoking the last one does not open the gateway).
    ever: bool = False
    by_hash: Mapping[str, Account] = field(default_factory=dict)
    by_id: Mapping[str, Account] = field(default_factory=dict)
    teams: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    spent: Mapping[tuple[str, float], float] = field(default_factory=dict)
    # Keys presented and found, so each is hashed once per read: no larger than `by_hash`, as
    # only a key that opens an account enters.
    found: dict[str, Account] = field(default_factory=dict)


class Directory:
    """The accounts of this process, swapped whole when the database's revision moves."""

    def __init__(self) -> None:
        self.known = Known()
        # Reads for `fresh`: how many began, the last one's number once it ended, and the turn
        # they take (one at a time; a caller joins the next read, never one already under way).
        self._begun = 0
        self._ended = 0
        self._turn = asyncio.Lock()

    def find(self, secret: str) -> Account | None:
        """The account a presented key opens, if any (expired ones included)."""
        known = self.known
        account = known.found.get(secret)
        if account is None and (account := known.by_hash.get(digest(secret))) is not None:
            known.found[secret] = account
        return account

    def spent(self, scope_id: str, start: float) -> float:
        """Dollars the database knew `scope_id` spent since `start`, at the last read."""
        return self.known.spent.get((scope_id, start), 0.0)

    async def fresh(self, db: Database, now: float | None = None) -> None:
        """The directory as the database holds it now: read again unless a read that began
        after this call has ended meanwhile (callers that come together share one read)."""
        arrived = self._begun
        async with self._turn:
            if self._ended > arrived:
                return
            self._begun += 1
            try:
                await self.refresh(db, now)
            finally:
                self._ended = self._begun

    async def refresh(self, db: Database, now: float | None = None) -> bool:
        """Read the database again if it changed; whether it did."""
        if await db.revision() == self.known.revision:
            return False
        revision, ever, key_rows, team_rows = await db.directory()
        teams = {row["name"]: row for row in team_rows}
        accounts = [(row["hash"], account_of(row, teams.get(row["team"])))
                    for row in key_rows]
        at = time.time() if now is None else now
        wanted = {(scope.kind, scope.name, window(scope.budget.period, at)[0])
                  for _, account in accounts for scope in account.scopes}
        spent = await db.spent(wanted)
        self.known = Known(revision, ever, dict(accounts),
                           {a.key_id: a for _, a in accounts}, teams, spent)
        return True
