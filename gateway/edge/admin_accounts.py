"""Admin routes for teams: virtual keys, teams, spend and the audit log (`gateway.accounts`).

Each needs an admin key, as every admin route (`auth.check_admin`); the admin key's id is the
actor the audit log names. A key's secret is in the answer that created it and nowhere else.
A change is made in the database first, then this process's directory is read again, so the
change holds here at once and on every other process within `database.poll_interval`.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, delete, get, patch, post

from gateway.accounts import auth
from gateway.accounts.account import Period, digest, new_secret
from gateway.accounts.database import GROUPS, GroupBy
from gateway.accounts.service import Accounts
from gateway.config.loader import BIND_ENV
from gateway.config.snapshots import is_loopback
from gateway.core.errors import Conflict, DatabaseUnavailable
from gateway.core.settings import Snapshot
from gateway.state.runtime import Runtime
from providers.contract.errors import InvalidRequest, NotFound

JSON = "application/json"
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")]
Alias = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Count = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)]
Models = Annotated[list[Alias], msgspec.Meta(max_length=1000)]
# MCP tools a key or team may call: namespaced names or shell-style patterns (`gateway.mcp`).
Tools = Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=128)]],
                  msgspec.Meta(max_length=1000)]
Metadata = Annotated[dict[str, Any], msgspec.Meta(max_length=100)]
MAX_AUDIT = 1000


class BudgetBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`{"usd": 20.0, "period": "month"}`."""

    usd: Annotated[float, msgspec.Meta(ge=0, le=1e9)]
    period: Period = "month"


class KeyBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /admin/keys`."""

    name: Name
    team: Name | None = None
    models: Models | None = None
    mcp_tools: Tools | None = None
    rpm: Count | None = None
    tpm: Count | None = None
    max_parallel: Count | None = None
    budget: BudgetBody | None = None
    expires_at: dt.datetime | None = None
    metadata: Metadata | None = None


class KeyPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`PATCH /admin/keys/{id}`: a field left out is kept, a null one cleared."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    team: Name | msgspec.UnsetType | None = msgspec.UNSET
    models: Models | msgspec.UnsetType | None = msgspec.UNSET
    mcp_tools: Tools | msgspec.UnsetType | None = msgspec.UNSET
    rpm: Count | msgspec.UnsetType | None = msgspec.UNSET
    tpm: Count | msgspec.UnsetType | None = msgspec.UNSET
    max_parallel: Count | msgspec.UnsetType | None = msgspec.UNSET
    budget: BudgetBody | msgspec.UnsetType | None = msgspec.UNSET
    expires_at: dt.datetime | msgspec.UnsetType | None = msgspec.UNSET
    metadata: Metadata | msgspec.UnsetType | None = msgspec.UNSET


class TeamBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /admin/teams`."""

    name: Name
    models: Models | None = None
    mcp_tools: Tools | None = None
    rpm: Count | None = None
    tpm: Count | None = None
    max_parallel: Count | None = None
    budget: BudgetBody | None = None
    metadata: Metadata | None = None


class TeamPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`PATCH /admin/teams/{name}`."""

    models: Models | msgspec.UnsetType | None = msgspec.UNSET
    mcp_tools: Tools | msgspec.UnsetType | None = msgspec.UNSET
    rpm: Count | msgspec.UnsetType | None = msgspec.UNSET
    tpm: Count | msgspec.UnsetType | None = msgspec.UNSET
    max_parallel: Count | msgspec.UnsetType | None = msgspec.UNSET
    budget: BudgetBody | msgspec.UnsetType | None = msgspec.UNSET
    metadata: Metadata | msgspec.UnsetType | None = msgspec.UNSET


def _columns(body: msgspec.Struct) -> dict[str, Any]:
    """A body's fields as table columns: the budget split in two, times as epoch seconds."""
    columns: dict[str, Any] = {}
    for name in body.__struct_fields__:
        value = getattr(body, name)
        if value is msgspec.UNSET:
            continue
        if name == "budget":
            columns["budget_usd"] = value.usd if value is not None else None
            columns["budget_period"] = value.period if value is not None else None
        elif name == "expires_at":
            columns[name] = _epoch(value) if value is not None else None
        else:
            columns[name] = value
    return columns


def _epoch(value: dt.datetime) -> float:
    """A time as epoch seconds; one without a zone is UTC."""
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()


def _iso(at: float | None) -> str | None:
    return None if at is None else dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


def key_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A key as the admin API shows it: never its secret nor its hash."""
    return {
        "id": row["id"], "object": "key", "name": row["name"],
        "key_hint": f"{row['prefix']}...{row['last4']}", "team": row["team"],
        "models": row["models"], "mcp_tools": row.get("mcp_tools"), "rpm": row["rpm"],
        "tpm": row["tpm"], "max_parallel": row["max_parallel"], "budget": _budget(row),
        "expires_at": _iso(row["expires_at"]), "metadata": row["metadata"] or {},
        "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"]),
        "revoked_at": _iso(row["revoked_at"]), "created_by": row["created_by"]}


def team_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A team as the admin API shows it."""
    return {"name": row["name"], "object": "team", "models": row["models"],
            "mcp_tools": row.get("mcp_tools"),
            "rpm": row["rpm"], "tpm": row["tpm"], "max_parallel": row["max_parallel"],
            "budget": _budget(row), "metadata": row["metadata"] or {},
            "created_at": _iso(row["created_at"]), "updated_at": _iso(row["updated_at"])}


def _budget(row: Mapping[str, Any]) -> dict[str, Any] | None:
    if row["budget_usd"] is None:
        return None
    return {"usd": row["budget_usd"], "period": row["budget_period"]}


def _decode(raw: bytes, into: type[Any]) -> Any:
    try:
        return msgspec.json.decode(raw or b"{}", type=into)
    except msgspec.ValidationError as exc:
        raise InvalidRequest.from_msgspec(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}") from None


async def _admin(request: Request[Any, Any, Any]) -> tuple[Runtime, Accounts, str]:
    """The runtime, its accounts, and who acts; 503 when the accounts never started."""
    runtime: Runtime = request.app.state.runtime
    actor = auth.check_admin(request.headers, runtime.live.snapshot,
                             request.client.host if request.client else "", runtime.accounts)
    if runtime.accounts is None or not runtime.accounts.migrated:
        raise DatabaseUnavailable("The accounts database is unavailable")
    return runtime, runtime.accounts, actor


def _json(body: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(body), media_type=JSON, status_code=status)


async def _changed(accounts: Accounts) -> None:
    """This process sees the change at once (the others at their next poll)."""
    await accounts.directory.refresh(accounts.db)


@post("/admin/keys", status_code=201)
async def create_key(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A new virtual key: the answer carries its secret, the only time it is shown."""
    runtime, accounts, actor = await _admin(request)
    body: KeyBody = _decode(await request.body(), KeyBody)
    secret, now = new_secret(), time.time()
    row = {**_columns(body), "id": f"key_{os.urandom(8).hex()}", "hash": digest(secret),
           "prefix": secret[:12], "last4": secret[-4:], "created_at": now, "updated_at": now,
           "created_by": actor}
    await accounts.db.add_key(row, actor, key_view({**row, "revoked_at": None,
                                                     **_defaults(row)}))
    await _changed(accounts)
    found = await accounts.db.key(row["id"])
    assert found is not None
    return _json(_warned({**key_view(found), "key": secret}, runtime, body), 201)


def _warned(view: dict[str, Any], runtime: Runtime, body: msgspec.Struct) -> dict[str, Any]:
    """`view`, with `warnings` when the change is kept but no request could use it as asked
    (an alias no provider serves, an expiry already past): a typo is said, not silent."""
    said = warnings(runtime.live.snapshot, getattr(body, "models", None),
                    getattr(body, "expires_at", None), time.time())
    return {**view, "warnings": said} if said else view


def warnings(snapshot: Snapshot, models: Any, expires_at: Any, now: float) -> list[str]:
    """What a key's or team's fields promise that the gateway cannot keep (pure)."""
    said = []
    if isinstance(models, list):
        unknown = [m for m in models if snapshot.resolve(m) not in snapshot.routes]
        if unknown:
            said.append(f"models: no provider serves {', '.join(unknown)[:500]}")
    if isinstance(expires_at, dt.datetime) and _epoch(expires_at) <= now:
        said.append("expires_at: already past: the key is refused from the start")
    return said


def _defaults(row: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("team", "models", "mcp_tools", "rpm", "tpm", "max_parallel", "budget_usd",
            "budget_period", "expires_at", "metadata")
    return {k: row.get(k) for k in keys}


@get("/admin/keys")
async def list_keys(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every key, revoked ones included (never a secret); `?team=` narrows to one team."""
    _, accounts, _ = await _admin(request)
    rows = await accounts.db.keys(request.query_params.get("team"))
    return _json({"object": "list", "data": [key_view(r) for r in rows]})


@get("/admin/keys/{key_id:str}")
async def get_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """One key."""
    _, accounts, _ = await _admin(request)
    row = await accounts.db.key(key_id)
    if row is None:
        raise NotFound(f"No key with id '{key_id[:64]}'")
    return _json(key_view(row))


@patch("/admin/keys/{key_id:str}")
async def update_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """Change a key's team, aliases, limits, budget, expiry or metadata."""
    runtime, accounts, actor = await _admin(request)
    body: KeyPatch = _decode(await request.body(), KeyPatch)
    row = await accounts.db.update_key(key_id, _columns(body), actor)
    if row is None:
        raise NotFound(f"No live key with id '{key_id[:64]}'")
    await _changed(accounts)
    return _json(_warned(key_view(row), runtime, body))


@delete("/admin/keys/{key_id:str}", status_code=200)
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """Revoke a key: refused from the next request here, everywhere within a second."""
    _, accounts, actor = await _admin(request)
    row = await accounts.db.update_key(key_id, {"revoked_at": time.time()}, actor,
                                       "key_revoked")
    if row is None:
        raise NotFound(f"No live key with id '{key_id[:64]}'")
    await _changed(accounts)
    return _json(key_view(row))


@post("/admin/reopen", status_code=200)
async def reopen(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Revoke every virtual key and serve without keys again, as before the first was made;
    refused (409) on a gateway that listens beyond this machine, where that would let anyone
    spend its providers' credits."""
    runtime, accounts, actor = await _admin(request)
    bind = os.environ.get(BIND_ENV) or runtime.live.snapshot.server.host
    if not is_loopback(bind):
        raise Conflict(f"This gateway listens on {bind}, beyond this machine: serving it "
                       "without keys would let anyone reach its providers; revoke keys one by "
                       "one instead")
    revoked = await accounts.db.reopen(actor)
    await _changed(accounts)
    return _json({"reopened": True, "revoked": revoked})


@post("/admin/teams", status_code=201)
async def create_team(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A new team."""
    runtime, accounts, actor = await _admin(request)
    body: TeamBody = _decode(await request.body(), TeamBody)
    now = time.time()
    row = {**_columns(body), "created_at": now, "updated_at": now}
    await accounts.db.add_team(row, actor)
    await _changed(accounts)
    return _json(_warned(team_view({**_team_defaults(), **row}), runtime, body), 201)


def _team_defaults() -> dict[str, Any]:
    return dict.fromkeys(("models", "mcp_tools", "rpm", "tpm", "max_parallel", "budget_usd",
                          "budget_period", "metadata"))


@get("/admin/teams")
async def list_teams(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every team."""
    _, accounts, _ = await _admin(request)
    return _json({"object": "list", "data": [team_view(r) for r in await accounts.db.teams()]})


@patch("/admin/teams/{name:str}")
async def update_team(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """Change a team's aliases, limits, budget or metadata."""
    runtime, accounts, actor = await _admin(request)
    body: TeamPatch = _decode(await request.body(), TeamPatch)
    row = await accounts.db.update_team(name, _columns(body), actor)
    if row is None:
        raise NotFound(f"No team named '{name[:64]}'")
    await _changed(accounts)
    return _json(_warned(team_view(row), runtime, body))


@delete("/admin/teams/{name:str}", status_code=200)
async def delete_team(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """Delete a team that has no live key."""
    _, accounts, actor = await _admin(request)
    if not await accounts.db.delete_team(name, actor):
        raise NotFound(f"No team named '{name[:64]}'")
    await _changed(accounts)
    return _json({"name": name, "object": "team", "deleted": True})


def _when(request: Request[Any, Any, Any], param: str) -> float | None:
    """A query time (ISO 8601, a date or a date-time; UTC without a zone) as epoch seconds."""
    raw = request.query_params.get(param)
    if raw is None:
        return None
    try:
        return _epoch(dt.datetime.fromisoformat(raw.replace("Z", "+00:00")))
    except ValueError:
        raise InvalidRequest(f"{param} must be an ISO 8601 date or date-time, got "
                             f"{raw[:40]!r}", param=param) from None


@get("/admin/spend")
async def spend(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Requests, tokens and dollars grouped by key, team, alias, provider, model or day, over
    `[start, end)`; this process's unwritten rows are written first."""
    _, accounts, _ = await _admin(request)
    group_by = request.query_params.get("group_by", "key")
    if group_by not in GROUPS:
        raise InvalidRequest(f"group_by must be one of {', '.join(GROUPS)}", param="group_by")
    start, end = _when(request, "start"), _when(request, "end")
    await accounts.flush()
    rows = await accounts.db.spend_report(_group(group_by), start, end)
    return _json({"object": "list", "group_by": group_by, "start": _iso(start),
                  "end": _iso(end), "data": rows})


def _group(value: str) -> GroupBy:
    groups: dict[str, GroupBy] = {"key": "key", "team": "team", "alias": "alias",
                                  "provider": "provider", "day": "day", "model": "model"}
    return groups[value]


@get("/admin/audit")
async def audit_log(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Admin actions, newest first: who, when, what, and what changed."""
    _, accounts, _ = await _admin(request)
    raw = request.query_params.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_AUDIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_AUDIT}", param="limit")
    rows = await accounts.db.audit_log(_when(request, "start"), _when(request, "end"), int(raw))
    return _json({"object": "list", "data": [
        {"time": _iso(r["time"]), "actor": r["actor"], "action": r["action"],
         "target": r["target"], "change": r["change"] or {}} for r in rows]})


ROUTES = [create_key, list_keys, get_key, update_key, revoke_key, reopen, create_team, list_teams,
          update_team, delete_team, spend, audit_log]
