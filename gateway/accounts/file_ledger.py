"""The ledger the workers of one machine share without Redis: a SQLite file, taken in turns by
`flock`, holding every budget's spent and held counts (`Ledger`'s contract, `ledger.py`).

Every transaction runs on one thread of the ledger's own, in the order they were asked, never on
the event loop: while another worker holds the file (or a process that is not a gateway holds
its lock), this worker goes on answering everything else. A reservation waits for its turn at
most `LOCK_WAIT` seconds from when it was asked (the ledger is then unavailable for it, and the
worker counts it in its own memory meanwhile); a settlement at most `SETTLE_WAIT`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from gateway.accounts.account import NANO
from gateway.accounts.ledger import (
    HOLD_TTL,
    Counted,
    Hold,
    Known,
    LedgerUnavailable,
    Over,
    Windows,
    expiry,
    new_id,
)
from providers.contract.log import get_logger

LOCK_WAIT = 2.0  # a request waits no longer than this for the file
SETTLE_WAIT = 30.0  # what a request spent is worth waiting for longer: its hold would linger
# How often a transaction waiting for the file looks again: from a fraction of a millisecond
# (another worker's turn takes microseconds) up to this.
_POLL_MOST = 0.01
# An entry to write: the scope, its window's start and end, what it had spent before (nanos).
_Entry = tuple[Counted, float, float | None, int]


class FileLedger:
    """Budgets counted in a SQLite file that the workers of one machine share (several workers
    and no Redis): each reservation and settlement is one short transaction, so the workers'
    holds are checked against each other's. The file lives in the state directory, is never the
    accounts database, and holds only counts and holds.

    The workers take turns by an `flock` on a file beside it before each transaction, taken by
    the ledger's thread (`_turn`), so neither waiting for it nor SQLite's own busy handler ever
    sleeps in the event loop."""

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
        # One thread: SQLite's connection and the lock are used by it alone, in order.
        self.thread = concurrent.futures.ThreadPoolExecutor(1, "budgets-file")

    @contextlib.contextmanager
    def _turn(self, deadline: float | None = None) -> Iterator[None]:
        """The file's lock, waited for until `deadline` (monotonic; None: for as long as it
        takes), then LedgerUnavailable."""
        if deadline is None:
            fcntl.flock(self.lock, fcntl.LOCK_EX)
        else:
            pause = 0.0002
            while True:
                try:
                    fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LedgerUnavailable("the budgets file stayed locked") from None
                    time.sleep(pause)
                    pause = min(pause * 2, _POLL_MOST)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _transaction(self, deadline: float) -> Iterator[sqlite3.Connection]:
        """This worker's turn (by `deadline`) and one transaction in it, committed unless it
        raised."""
        with self._turn(deadline):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    async def reserve(self, scopes: Sequence[Counted], amount: int, known: Known,
                      now: float, ttl: float = HOLD_TTL) -> Hold | Over:
        """All scopes held in one transaction, or none, on the ledger's thread."""
        entries = [(scope, start, end, round(known(scope.id, start) * NANO))
                   for scope, start, end in self.windows.entries(scopes, now)]
        hold = Hold(new_id(), tuple((scope.id, start) for scope, start, _, _ in entries), amount,
                    0.0)
        job = self.thread.submit(self._reserve, hold, entries, now, expiry(now, ttl),
                                 time.monotonic() + LOCK_WAIT)
        try:
            return await asyncio.wrap_future(job)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc
        except asyncio.CancelledError:  # its request left: a hold made meanwhile is let go
            job.add_done_callback(self._let_go)
            raise

    def _let_go(self, job: concurrent.futures.Future[Hold | Over]) -> None:
        if not job.cancelled() and job.exception() is None \
                and isinstance(held := job.result(), Hold):
            with contextlib.suppress(RuntimeError):  # closing: the hold expires by itself
                self.settle(held, 0)

    async def renew(self, holds: Sequence[Hold], now: float, ttl: float) -> None:
        """One transaction for every hold still held, on the ledger's thread."""
        if not holds:
            return
        job = self.thread.submit(self._renew, [h.id for h in holds], expiry(now, ttl),
                                 time.monotonic() + LOCK_WAIT)
        try:
            await asyncio.wrap_future(job)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc

    def _renew(self, ids: list[str], until: int, deadline: float) -> None:
        with self._transaction(deadline) as db:
            db.executemany("UPDATE holds SET deadline = ? WHERE id = ?",
                           [(until, hold_id) for hold_id in ids])

    def _reserve(self, hold: Hold, entries: list[_Entry], now: float, until: int,
                 deadline: float) -> Hold | Over:
        if time.monotonic() >= deadline:  # asked while the file was held: not worth a try now
            raise LedgerUnavailable("the budgets file stayed locked")
        amount = hold.amount
        remaining = []
        with self._transaction(deadline) as db:  # a refusal commits too: the holds it expired
            for scope, start, end, spent_before in entries:
                entry = f"{scope.id}@{int(start)}"
                db.execute("INSERT OR IGNORE INTO counts VALUES (?, ?, 0)",
                           (entry, spent_before))
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
                           (hold.id, key, amount, until))
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
        """Settle `hold` to `cost`, on the ledger's thread (after whatever was asked before)."""
        if hold.settled:
            return
        hold.settled = True
        self.thread.submit(self._settle, hold, cost, time.monotonic() + SETTLE_WAIT)

    def _settle(self, hold: Hold, cost: int, deadline: float) -> None:
        try:
            with self._transaction(deadline) as db:
                for scope_id, start in hold.entries:
                    entry = f"{scope_id}@{int(start)}"
                    held = db.execute("SELECT amount FROM holds WHERE id = ? AND entry = ?",
                                      (hold.id, entry)).fetchone()
                    if held is not None:
                        db.execute("DELETE FROM holds WHERE id = ? AND entry = ?",
                                   (hold.id, entry))
                    db.execute("UPDATE counts SET reserved = reserved - ?, spent = spent + ? "
                               "WHERE entry = ?", (held[0] if held else 0, cost, entry))
        except (sqlite3.Error, LedgerUnavailable) as exc:  # the hold expires by itself; the
            # spend row still counts
            get_logger().warning("budget_settle_failed", error=str(exc) or type(exc).__name__)

    def close(self) -> None:
        """Finish what was asked (settlements, each within its wait), then let go of the file."""
        self.thread.shutdown(wait=True)
        self.db.close()
        os.close(self.lock)
