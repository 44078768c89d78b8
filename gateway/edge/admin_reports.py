"""Admin reports on the accounts: spend grouped by key, team, alias, provider, model or day,
and the audit log of admin actions. Each needs an admin key or a console session
(`gateway.edge.access`); a team admin's spend is their own teams'.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from litestar import Request, Response, get

from gateway.accounts.database import GROUPS, GroupBy
from gateway.edge.admin_accounts import acting, answer, epoch, iso
from providers.contract.errors import InvalidRequest

MAX_AUDIT = 1000


def when(request: Request[Any, Any, Any], param: str) -> float | None:
    """A query time (ISO 8601, a date or a date-time; UTC without a zone) as epoch seconds."""
    raw = request.query_params.get(param)
    if raw is None:
        return None
    try:
        return epoch(dt.datetime.fromisoformat(raw.replace("Z", "+00:00")))
    except ValueError:
        raise InvalidRequest(f"{param} must be an ISO 8601 date or date-time, got "
                             f"{raw[:40]!r}", param=param) from None


@get("/admin/spend")
async def spend(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Requests, tokens and dollars grouped by key, team, alias, provider, model or day, over
    `[start, end)`; this process's unwritten rows are written first."""
    _, accounts, who = await acting(request, team_scoped=True)
    group_by = request.query_params.get("group_by", "key")
    if group_by not in GROUPS:
        raise InvalidRequest(f"group_by must be one of {', '.join(GROUPS)}", param="group_by")
    start, end = when(request, "start"), when(request, "end")
    await accounts.flush()
    rows = await accounts.db.spend_report(_group(group_by), start, end,
                                          who.teams if who.role == "team_admin" else None)
    return answer({"object": "list", "group_by": group_by, "start": iso(start),
                  "end": iso(end), "data": rows})


def _group(value: str) -> GroupBy:
    groups: dict[str, GroupBy] = {"key": "key", "team": "team", "alias": "alias",
                                  "provider": "provider", "day": "day", "model": "model"}
    return groups[value]


@get("/admin/audit")
async def audit_log(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Admin actions, newest first: who, when, what, and what changed."""
    _, accounts, _ = await acting(request)
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_AUDIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_AUDIT}", param="limit")
    rows = await accounts.db.audit_log(when(request, "start"), when(request, "end"), int(raw))
    return answer({"object": "list", "data": [
        {"time": iso(r["time"]), "actor": r["actor"], "action": r["action"],
         "target": r["target"], "change": r["change"] or {}} for r in rows]})


ROUTES = [spend, audit_log]
