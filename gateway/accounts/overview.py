"""What the status page shows of spend: today's and this month's requests and dollars, the keys
that spent most this month, and the budgets at or past 80% of their limit.

It is read from the database at most once every `TTL` seconds: the page asks every two seconds
from every tab that has it open, and a spend total ten seconds old says the same. A database
that is down is said so (and asked again after `TTL`, not at every refresh).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway.accounts.account import Scope, window
from gateway.accounts.service import Accounts
from gateway.core.errors import DatabaseUnavailable

TTL = 10.0
NEAR = 0.8  # a budget this far used is listed
TOP = 5  # keys listed by this month's dollars


def _iso(at: float | None) -> str | None:
    return None if at is None else dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


def near_limit(scopes: Iterable[Scope], spent: Mapping[tuple[str, float], float], now: float,
               at_least: float = NEAR) -> list[dict[str, Any]]:
    """The budgets whose current period has used `at_least` of their limit (a zero budget is
    wholly used), fullest first; `spent` is dollars by (scope id, period start)."""
    rows = []
    for scope in scopes:
        start, end = window(scope.budget.period, now)
        used, limit = spent.get((scope.id, start), 0.0), scope.budget.usd
        share = used / limit if limit > 0 else 1.0
        if share >= at_least:
            rows.append({"scope": scope.kind, "name": scope.name, "spent": round(used, 9),
                         "limit": limit, "period": scope.budget.period,
                         "used": round(share, 4), "resets_at": _iso(end)})
    return sorted(rows, key=lambda row: (-row["used"], row["scope"], row["name"]))


class Overview:
    """The spend section of `/status.json` for one process, kept for `ttl` seconds."""

    def __init__(self, accounts: Accounts, clock: Callable[[], float] = time.time,
                 ttl: float = TTL) -> None:
        self._accounts = accounts
        self._clock = clock
        self._ttl = ttl
        self._kept: tuple[float, dict[str, Any]] | None = None
        self._reading = asyncio.Lock()  # tabs refreshing together share one read

    async def view(self) -> dict[str, Any]:
        """The section, read again once it is `ttl` seconds old."""
        async with self._reading:
            now = self._clock()
            if self._kept is None or now - self._kept[0] >= self._ttl:
                self._kept = (now, await self._read(now))
            return self._kept[1]

    async def _read(self, now: float) -> dict[str, Any]:
        accounts, db = self._accounts, self._accounts.db
        # Every budget a live key falls under, once (a team's is shared by its keys).
        scopes = {scope.id: scope for account in accounts.directory.known.by_id.values()
                  for scope in account.scopes}
        day, month = window("day", now)[0], window("month", now)[0]
        try:
            await accounts.flush()  # this process's rows first, as /admin/spend does
            totals, top = await db.spend_since({"today": day, "month": month}, month, TOP)
            spent = await db.spent({(scope.kind, scope.name, window(scope.budget.period,
                                                                    now)[0])
                                    for scope in scopes.values()})
        except DatabaseUnavailable as exc:
            return {"available": False, "error": exc.message, "at": _iso(now)}
        return {"available": True, "at": _iso(now),
                "today": {"requests": totals["today"][0], "cost": round(totals["today"][1], 9)},
                "month": {"requests": totals["month"][0], "cost": round(totals["month"][1], 9)},
                "top_keys": top, "near_limit": near_limit(scopes.values(), spent, now)}
