"""`/admin/logs`: the request log (`gateway.requestlog`), found by filters or by request id.

Admin routes like every other (`access.caller`): an admin key, or a console session; a viewer
reads every row, a team admin their own teams' rows only, narrowed in the query (another team's
request is not found, as another team's key is). A listing is a page of rows, newest first,
without bodies, and the opaque cursor of the next page; `format=ndjson` streams every matching
row instead, a page at a time. One request (`/admin/logs/{request_id}`, the answer's
`x-request-id`) shows its attempts and whether its bodies were kept: `payload` is `disabled`
(capture was off for it), `not_captured` (on, but not kept: a `private` key) or `stored` (then
`request_body` and `response_body` hold them). This process's unwritten rows are written first,
so a request just answered here is found.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
from litestar import Request, Response, get
from litestar.response import Stream

from gateway.core.errors import DatabaseUnavailable
from gateway.edge.access import Caller, caller
from gateway.requestlog.journal import Journal
from gateway.requestlog.store import Filters
from gateway.state.runtime import Runtime
from providers.contract.errors import InvalidRequest, NotFound
from providers.contract.log import get_logger

JSON = "application/json"
NDJSON = "application/x-ndjson"
DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
EXPORT_PAGE = 500  # rows read per query while streaming an export
MAX_Q = 256
PARAMS = frozenset(("key", "team", "alias", "model", "provider", "status", "since", "until",
                    "q", "limit", "cursor", "format"))
_BOOLEAN = ("stream", "hedged", "hedge_won", "cache_hit", "replayed")


async def _journal(request: Request[Any, Any, Any]) -> tuple[Journal, Caller]:
    """The request log and who reads it, once the caller may read it (an admin, a viewer, a
    team admin) and the database is migrated."""
    runtime: Runtime = request.app.state.runtime
    who = await caller(request, team_scoped=True)
    if runtime.accounts is None or not runtime.accounts.migrated:
        raise DatabaseUnavailable("The accounts database is unavailable")
    journal: Journal = request.app.state.journal
    await journal.flush()
    return journal, who


def _scoped(found: Filters, who: Caller) -> Filters:
    """The filters narrowed to the caller's teams when they are a team admin (in the query:
    pages and the export stay whole)."""
    return dataclasses.replace(found, teams=who.teams) if who.role == "team_admin" else found


def filters(query: Mapping[str, str]) -> tuple[Filters, int | None, tuple[float, int] | None,
                                                 bool]:
    """The query string read: its filters, `limit`, the cursor's position, and whether it asks
    for ndjson; InvalidRequest naming the parameter that is wrong (pure)."""
    for name in query:
        if name not in PARAMS:
            raise InvalidRequest(f"Unknown parameter '{name[:40]}': use one of "
                                 f"{', '.join(sorted(PARAMS))}", param=name[:40])
    text = {name: _text(query, name) for name in ("key", "team", "alias", "model", "provider")}
    status = query.get("status")
    if status is not None and not (status.isdigit() and 100 <= int(status) <= 599):
        raise InvalidRequest("status must be an HTTP status, 100 to 599", param="status")
    q = query.get("q")
    if q is not None and not 1 <= len(q) <= MAX_Q:
        raise InvalidRequest(f"q must be 1 to {MAX_Q} characters", param="q")
    limit = query.get("limit")
    if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= MAX_LIMIT):
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit")
    form = query.get("format", "json")
    if form not in ("json", "ndjson"):
        raise InvalidRequest("format must be json or ndjson", param="format")
    found = Filters(key=text["key"], team=text["team"], alias=text["alias"],
                    model=text["model"], provider=text["provider"],
                    status=int(status) if status is not None else None,
                    since=_when(query, "since"), until=_when(query, "until"), q=q)
    return found, int(limit) if limit is not None else None, _position(query.get("cursor")), \
        form == "ndjson"


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name)
    if value is not None and not 1 <= len(value) <= 256:
        raise InvalidRequest(f"{name} must be 1 to 256 characters", param=name)
    return value


def _when(query: Mapping[str, str], param: str) -> float | None:
    """A time in ISO 8601 (a date or a date-time; UTC without a zone) as epoch seconds."""
    raw = query.get(param)
    if raw is None:
        return None
    try:
        at = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"{param} must be an ISO 8601 date or date-time, got "
                             f"{raw[:40]!r}", param=param) from None
    return (at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp()


def cursor(row: Mapping[str, Any]) -> str:
    """The opaque cursor of the page after `row`."""
    return base64.urlsafe_b64encode(msgspec.json.encode([row["time"], row["id"]])).decode() \
        .rstrip("=")


def _position(raw: str | None) -> tuple[float, int] | None:
    if raw is None:
        return None
    try:
        at, row_id = msgspec.json.decode(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)),
                                         type=tuple[float, int])
    except (binascii.Error, ValueError, msgspec.MsgspecError):
        raise InvalidRequest("cursor is not one this API gave", param="cursor") from None
    return at, row_id


def view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as the API shows it: times in ISO 8601, the attempts and guardrail actions as
    lists, the hedge and its winner, the bodies only where the row has them."""
    shown = {name: value for name, value in row.items()
             if name not in ("id", "key_id", "time", "attempts", "guardrails")}
    shown.update({name: bool(row[name]) for name in _BOOLEAN})
    winner = row["provider"] if row["hedged"] else None
    return {"request_id": row["request_id"],
            "time": dt.datetime.fromtimestamp(row["time"], dt.UTC).isoformat(),
            "key": row["key_id"], **shown,
            "attempts": msgspec.json.decode(row["attempts"]),
            "guardrails": msgspec.json.decode(row["guardrails"]),
            "hedge": {"winner": winner, "won_by": "hedge" if row["hedge_won"] else "first"}
            if row["hedged"] else None}


@get("/admin/logs")
async def list_logs(request: Request[Any, Any, Any]) -> Response[bytes] | Stream:
    """Logged requests matching the filters, newest first, a page at a time (or all of them,
    as ndjson)."""
    journal, who = await _journal(request)
    found, limit, after, ndjson = filters(request.query_params)
    found = _scoped(found, who)
    if ndjson:
        return Stream(_export(journal, found, limit, after), media_type=NDJSON)
    wanted = limit or DEFAULT_LIMIT
    rows = await journal.store.page(found, wanted + 1, after)
    more = len(rows) > wanted
    rows = rows[:wanted]
    return Response(msgspec.json.encode({
        "data": [view(r) for r in rows],
        "next_cursor": cursor(rows[-1]) if more else None}), media_type=JSON)


async def _export(journal: Journal, found: Filters, limit: int | None,
                  after: tuple[float, int] | None) -> AsyncIterator[bytes]:
    """Every matching row as one JSON line, read a page at a time (up to `limit` rows)."""
    left = limit
    while left is None or left > 0:
        size = EXPORT_PAGE if left is None else min(EXPORT_PAGE, left)
        try:
            rows = await journal.store.page(found, size, after)
        except DatabaseUnavailable as exc:  # the answer has begun: said in-band
            get_logger().warning("request_log_export_cut", error=str(exc))
            yield msgspec.json.encode({"error": {"message": str(exc),
                                                 "code": "database_unavailable"}}) + b"\n"
            return
        if rows:
            yield b"".join(msgspec.json.encode(view(r)) + b"\n" for r in rows)
        if len(rows) < size:
            return
        after = (rows[-1]["time"], rows[-1]["id"])
        left = None if left is None else left - len(rows)


@get("/admin/logs/{request_id:str}")
async def get_log(request: Request[Any, Any, Any], request_id: str) -> Response[bytes]:
    """One logged request: its attempts, and its bodies when they were kept."""
    journal, who = await _journal(request)
    row = await journal.store.one(request_id)
    if row is None or not who.owns(row["team"]):  # another team's request: none to them
        off = "" if journal.settings() is not None else \
            " (the request log is off: add a `logs` section to llms.json)"
        raise NotFound(f"No logged request with id '{request_id[:128]}'{off}")
    return Response(msgspec.json.encode(view(row)), media_type=JSON)


ROUTES = [list_logs, get_log]
