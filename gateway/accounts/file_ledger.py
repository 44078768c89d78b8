"""The ledger the workers of one machine share without Redis: a SQLite file, taken in turns by
`flock`, holding every budget's spent and held counts (`Ledger`'s contract, `ledger.py`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.accounts.account import NANO
from gateway.accounts.ledger import (
    HOLD_TTL,
    Counted,
    Hold,
    Known,
    LedgerUnavailable,
    Over,
    Windows,
    new_id,
)
from providers.contract.log import get_logger

if TYPE_CHECKING:
    pass


class FileLedger:
    """Budgets counted in a SQLite file that the workers of one machine share (several workers
    and no Redis): each reservation and settlement is one short transaction, so the workers'
    holds are checked against each other's. The file lives in the state directory, is never the
    accounts database, and holds only counts and holds.

    The workers take turns by an `flock` on a file beside it before each transaction: a worker
    waiting for another's few microseconds wakes when the lock is let go. SQLite's own busy
    handler would sleep in the event loop for milliseconds at a time instead."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        # Autocommit: the transactions below are written out.
        self.db = sqlite3.connect(path, timeout=5, isolation_level=None,
                                  check_same_thread=False)
        with self._turn():  # workers starting together make the file one at a time
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=OFF")  # a crash may lose counts, not spend
            self.db.execute("CREATE TABLE IF NOT EXISTS counts (entry TEXT PRIMARY KEY, "
                            "spent INTEGER NOT NULL, reserved INTEGER NOT NULL)")
            self.db.execute("CREATE TABLE IF NOT EXISTS holds (id TEXT, entry TEXT, "
                            "amount INTEGER NOT NULL, deadline REAL NOT NULL, "
                            "PRIMARY KEY (id, entry))")
        self.windows = Windows()

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """This worker's turn and one transaction in it, committed unless it raised."""
        with self._turn():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    async def reserve(self, scopes: Sequence[Counted], amount: int, known: Known,
                      now: float) -> Hold | Over:
        """All scopes held in one transaction, or none."""
        entries = self.windows.entries(scopes, now)
        hold = Hold(new_id(), tuple((scope.id, start) for scope, start, _ in entries), amount,
                    0.0)
        try:
            return self._reserve(hold, entries, known, now)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc

    def _reserve(self, hold: Hold, entries: list[tuple[Counted, float, float | None]],
                 known: Known, now: float) -> Hold | Over:
        amount = hold.amount
        remaining = []
        with self._transaction() as db:  # a refusal commits too: the expired holds it released
            for scope, start, end in entries:
                entry = f"{scope.id}@{int(start)}"
                db.execute("INSERT OR IGNORE INTO counts VALUES (?, ?, 0)",
                           (entry, round(known(scope.id, start) * NANO)))
                spent, reserved = db.execute("SELECT spent, reserved FROM counts WHERE entry = ?",
                                             (entry,)).fetchone()
                if spent + reserved + amount > scope.limit:
                    reserved -= self._expire(entry, now)
                    if spent + reserved + amount > scope.limit:
                        return Over(scope, (spent + reserved) / NANO, end)
                remaining.append(scope.limit - spent - reserved - amount)
            for scope_id, start in hold.entries:
                key = f"{scope_id}@{int(start)}"
                db.execute("UPDATE counts SET reserved = reserved + ? WHERE entry = ?",
                           (amount, key))
                db.execute("INSERT INTO holds VALUES (?, ?, ?, ?)",
                           (hold.id, key, amount, now + HOLD_TTL))
        hold.remaining = min(remaining, default=0) / NANO
        return hold

    def _expire(self, entry: str, now: float) -> int:
        released = self.db.execute("SELECT COALESCE(SUM(amount), 0) FROM holds WHERE entry = ? "
                                   "AND deadline <= ?", (entry, now)).fetchone()[0]
        if released:
            self.db.execute("DELETE FROM holds WHERE entry = ? AND deadline <= ?", (entry, now))
            self.db.execute("UPDATE counts SET reserved = reserved - ? WHERE entry = ?",
                            (released, entry))
        return int(released)

    def settle(self, hold: Hold, cost: int) -> None:
        if hold.settled:
            return
        hold.settled = True
        try:
            with self._transaction() as db:
                for scope_id, start in hold.entries:
                    entry = f"{scope_id}@{int(start)}"
                    held = db.execute("SELECT amount FROM holds WHERE id = ? AND entry = ?",
                                      (hold.id, entry)).fetchone()
                    if held is not None:
                        db.execute("DELETE FROM holds WHERE id = ? AND entry = ?",
                                   (hold.id, entry))
                    db.execute("UPDATE counts SET reserved = reserved - ?, spent = spent + ? "
                               "WHERE entry = ?", (held[0] if held else 0, cost, entry))
        except sqlite3.Error as exc:  # the hold expires by itself; the spend row still counts
            get_logger().warning("budget_settle_failed", error=type(exc).__name__)

    def close(self) -> None:
        self.db.close()
        os.close(self.lock)
