"""Admin routes for teams: virtual keys and teams (`gateway.accounts`); their spend and the
audit log are `admin_reports`.

Each needs an admin key, as every admin route (`auth.check_admin`), or a console session
(`gateway.edge.access`): the admin key's id, or the person's email, is the actor the audit log
names; a team admin's session reaches their own teams' keys and spend only. A key's secret is
in the answer that created it and nowhere else. A change is made in the database first, then
this process's directory is read again, so the change holds here at once and on every other
process within `database.poll_interval`.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, delete, get, patch, post

from gateway.accounts.account import Period, digest, new_secret
from gateway.accounts.service import Accounts
from gateway.config.loader import BIND_ENV
from gateway.config.snapshots import is_loopback
from gateway.core.errors import Conflict, DatabaseUnavailable
from gateway.core.settings import Snapshot
from gateway.core.settings.logs import LogCapture
from gateway.edge.access import Caller, caller, own_team
from gateway.state.runtime import Runtime
from providers.contract.errors import InvalidRequest, NotFound

JSON = "application/json"
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f]+$")]
Alias = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Count = Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)]
Models = Annotated[list[Alias], msgspec.Meta(max_length=1000)]
Guardrails = Annotated[list[Alias], msgspec.Meta(max_length=100)]
# MCP tools a key or team may call: namespaced names or shell-style patterns (`gateway.mcp`).
Tools = Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=128)]],
                  msgspec.Meta(max_length=1000)]
Metadata = Annotated[dict[str, Any], msgspec.Meta(max_length=100)]


class BudgetBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`{"usd": 20.0, "period": "month"}`."""

    usd: Annotated[float, msgspec.Meta(ge=0, le=1e9)]
    period: Period = "month"


class KeyBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /admin/keys`."""

    name: Name
    team: Name | None = None
    models: Models | None = None
    guardrails: Guardrails | None = None
    mcp_tools: Tools | None = None
    rpm: Count | None = None
    tpm: Count | None = None
    max_parallel: Count | None = None
    budget: BudgetBody | None = None
    expires_at: dt.datetime | None = None
    metadata: Metadata | None = None
    logs: LogCapture | None = None  # what the request log keeps of its requests


class KeyPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`PATCH /admin/keys/{id}`: a field left out is kept, a null one cleared."""

    name: Name | msgspec.UnsetType = msgspec.UNSET
    team: Name | msgspec.UnsetType | None = msgspec.UNSET
    models: Models | msgspec.UnsetType | None = msgspec.UNSET
    guardrails: Guardrails | msgspec.UnsetType | None = msgspec.UNSET
    mcp_tools: Tools | msgspec.UnsetType | None = msgspec.UNSET
    rpm: Count | msgspec.UnsetType | None = msgspec.UNSET
    tpm: Count | msgspec.UnsetType | None = msgspec.UNSET
    max_parallel: Count | msgspec.UnsetType | None = msgspec.UNSET
    budget: BudgetBody | msgspec.UnsetType | None = msgspec.UNSET
    expires_at: dt.datetime | msgspec.UnsetType | None = msgspec.UNSET
    metadata: Metadata | msgspec.UnsetType | None = msgspec.UNSET
    logs: LogCapture | msgspec.UnsetType | None = msgspec.UNSET


class TeamBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`POST /admin/teams`."""

    name: Name
    models: Models | None = None
    guardrails: Guardrails | None = None
    mcp_tools: Tools | None = None
    rpm: Count | None = None
    tpm: Count | None = None
    max_parallel: Count | None = None
    budget: BudgetBody | None = None
    metadata: Metadata | None = None


class TeamPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`PATCH /admin/teams/{name}`."""

    models: Models | msgspec.UnsetType | None = msgspec.UNSET
    guardrails: Guardrails | msgspec.UnsetType | None = msgspec.UNSET
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
            columns[name] = epoch(value) if value is not None else None
        elif name == "logs":
            columns[name] = msgspec.to_builtins(value) if value is not None else None
        else:
            columns[name] = value
    return columns


def epoch(value: dt.datetime) -> float:
    """A time as epoch seconds; one without a zone is UTC."""
    return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()


def iso(at: float | None) -> str | None:
    return None if at is None else dt.datetime.fromtimestamp(at, dt.UTC).isoformat()


def key_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A key as the admin API shows it: never its secret nor its hash."""
    return {
        "id": row["id"], "object": "key", "name": row["name"],
        "key_hint": f"{row['prefix']}...{row['last4']}", "team": row["team"],
        "models": row["models"], "guardrails": row.get("guardrails"),
        "mcp_tools": row.get("mcp_tools"), "rpm": row["rpm"],
        "tpm": row["tpm"], "max_parallel": row["max_parallel"], "budget": _budget(row),
        "expires_at": iso(row["expires_at"]), "metadata": row["metadata"] or {},
        "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"]),
        "revoked_at": iso(row["revoked_at"]), "created_by": row["created_by"],
        "logs": row.get("logs")}


def team_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A team as the admin API shows it."""
    return {"name": row["name"], "object": "team", "models": row["models"],
            "guardrails": row.get("guardrails"), "mcp_tools": row.get("mcp_tools"),
            "rpm": row["rpm"], "tpm": row["tpm"], "max_parallel": row["max_parallel"],
            "budget": _budget(row), "metadata": row["metadata"] or {},
            "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}


def _budget(row: Mapping[str, Any]) -> dict[str, Any] | None:
    if row["budget_usd"] is None:
        return None
    return {"usd": row["budget_usd"], "period": row["budget_period"]}


def _decode(raw: bytes, into: type[Any], snapshot: Snapshot | None = None) -> Any:
    try:
        body = msgspec.json.decode(raw or b"{}", type=into)
    except msgspec.ValidationError as exc:
        raise InvalidRequest.from_msgspec(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}") from None
    if snapshot is not None:
        known_guardrails(snapshot, getattr(body, "guardrails", None))
    return body


def known_guardrails(snapshot: Snapshot, names: Any) -> None:
    """A 400 naming `guardrails` for a name llms.json's `guardrails` does not have: a key
    passing a guardrail that does not exist would pass nothing, silently."""
    if isinstance(names, list) and (unknown := [n for n in names
                                                if n not in snapshot.guardrails]):
        known = ", ".join(sorted(snapshot.guardrails)) or "none"
        raise InvalidRequest(f"No guardrail named {', '.join(map(repr, unknown))[:300]} in "
                             f"llms.json (configured: {known[:300]})", param="guardrails")


async def acting(request: Request[Any, Any, Any], team_scoped: bool = False
                 ) -> tuple[Runtime, Accounts, Caller]:
    """The runtime, its accounts, and who acts; 503 when the accounts never started."""
    runtime: Runtime = request.app.state.runtime
    who = await caller(request, team_scoped=team_scoped)
    if runtime.accounts is None or not runtime.accounts.migrated:
        raise DatabaseUnavailable("The accounts database is unavailable")
    return runtime, runtime.accounts, who


async def _own_key(accounts: Accounts, who: Caller, key_id: str, what: str = "key"
                   ) -> dict[str, Any]:
    """The key `key_id` if `who` may reach it: to a team admin, another team's key is no key."""
    row = await accounts.db.key(key_id)
    if row is None or not who.owns(row["team"]):
        raise NotFound(f"No {what} with id '{key_id[:64]}'")
    return row


def answer(body: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(body), media_type=JSON, status_code=status)


async def _changed(accounts: Accounts) -> None:
    """This process sees the change at once (the others at their next poll)."""
    await accounts.directory.refresh(accounts.db)


@post("/admin/keys", status_code=201)
async def create_key(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A new virtual key: the answer carries its secret, the only time it is shown."""
    runtime, accounts, who = await acting(request, team_scoped=True)
    body: KeyBody = _decode(await request.body(), KeyBody, runtime.live.snapshot)
    own_team(who, body.team)
    secret, now, actor = new_secret(), time.time(), who.actor
    row = {**_columns(body), "id": f"key_{os.urandom(8).hex()}", "hash": digest(secret),
           "prefix": secret[:12], "last4": secret[-4:], "created_at": now, "updated_at": now,
           "created_by": actor}
    await accounts.db.add_key(row, actor, key_view({**row, "revoked_at": None,
                                                     **_defaults(row)}))
    await _changed(accounts)
    found = await accounts.db.key(row["id"])
    assert found is not None
    return answer(_warned({**key_view(found), "key": secret}, runtime, body), 201)


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
    if isinstance(expires_at, dt.datetime) and epoch(expires_at) <= now:
        said.append("expires_at: already past: the key is refused from the start")
    return said


def _defaults(row: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("team", "models", "guardrails", "mcp_tools", "rpm", "tpm", "max_parallel",
            "budget_usd", "budget_period", "expires_at", "metadata", "logs")
    return {k: row.get(k) for k in keys}


@get("/admin/keys")
async def list_keys(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every key, revoked ones included (never a secret); `?team=` narrows to one team."""
    _, accounts, who = await acting(request, team_scoped=True)
    rows = await accounts.db.keys(request.query_params.get("team"))
    return answer({"object": "list", "data": [key_view(r) for r in rows if who.owns(r["team"])]})


@get("/admin/keys/{key_id:str}")
async def get_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """One key."""
    _, accounts, who = await acting(request, team_scoped=True)
    return answer(key_view(await _own_key(accounts, who, key_id)))


@patch("/admin/keys/{key_id:str}")
async def update_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """Change a key's team, aliases, limits, budget, expiry or metadata."""
    runtime, accounts, who = await acting(request, team_scoped=True)
    body: KeyPatch = _decode(await request.body(), KeyPatch, runtime.live.snapshot)
    await _own_key(accounts, who, key_id, "live key")
    if body.team is not msgspec.UNSET:
        own_team(who, body.team)
    row = await accounts.db.update_key(key_id, _columns(body), who.actor)
    if row is None:
        raise NotFound(f"No live key with id '{key_id[:64]}'")
    await _changed(accounts)
    return answer(_warned(key_view(row), runtime, body))


@delete("/admin/keys/{key_id:str}", status_code=200)
async def revoke_key(request: Request[Any, Any, Any], key_id: str) -> Response[bytes]:
    """Revoke a key: refused from the next request here, everywhere within a second."""
    _, accounts, who = await acting(request, team_scoped=True)
    await _own_key(accounts, who, key_id, "live key")
    row = await accounts.db.update_key(key_id, {"revoked_at": time.time()}, who.actor,
                                       "key_revoked")
    if row is None:
        raise NotFound(f"No live key with id '{key_id[:64]}'")
    await _changed(accounts)
    return answer(key_view(row))


@post("/admin/reopen", status_code=200)
async def reopen(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Revoke every virtual key and serve without keys again, as before the first was made;
    refused (409) on a gateway that listens beyond this machine, where that would let anyone
    spend its providers' credits."""
    runtime, accounts, who = await acting(request)
    bind = os.environ.get(BIND_ENV) or runtime.live.snapshot.server.host
    if not is_loopback(bind):
        raise Conflict(f"This gateway listens on {bind}, beyond this machine: serving it "
                       "without keys would let anyone reach its providers; revoke keys one by "
                       "one instead")
    revoked = await accounts.db.reopen(who.actor)
    await _changed(accounts)
    return answer({"reopened": True, "revoked": revoked})


@post("/admin/teams", status_code=201)
async def create_team(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A new team."""
    runtime, accounts, who = await acting(request)
    body: TeamBody = _decode(await request.body(), TeamBody, runtime.live.snapshot)
    now = time.time()
    row = {**_columns(body), "created_at": now, "updated_at": now}
    await accounts.db.add_team(row, who.actor)
    await _changed(accounts)
    return answer(_warned(team_view({**_team_defaults(), **row}), runtime, body), 201)


def _team_defaults() -> dict[str, Any]:
    return dict.fromkeys(("models", "guardrails", "mcp_tools", "rpm", "tpm", "max_parallel",
                          "budget_usd", "budget_period", "metadata"))


@get("/admin/teams")
async def list_teams(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every team."""
    _, accounts, who = await acting(request, team_scoped=True)
    return answer({"object": "list", "data": [team_view(r) for r in await accounts.db.teams()
                                             if who.owns(r["name"])]})


@patch("/admin/teams/{name:str}")
async def update_team(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """Change a team's aliases, limits, budget or metadata."""
    runtime, accounts, who = await acting(request)
    body: TeamPatch = _decode(await request.body(), TeamPatch, runtime.live.snapshot)
    row = await accounts.db.update_team(name, _columns(body), who.actor)
    if row is None:
        raise NotFound(f"No team named '{name[:64]}'")
    await _changed(accounts)
    return answer(_warned(team_view(row), runtime, body))


@delete("/admin/teams/{name:str}", status_code=200)
async def delete_team(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    """Delete a team that has no live key."""
    _, accounts, who = await acting(request)
    if not await accounts.db.delete_team(name, who.actor):
        raise NotFound(f"No team named '{name[:64]}'")
    await _changed(accounts)
    return answer({"name": name, "object": "team", "deleted": True})


ROUTES = [create_key, list_keys, get_key, update_key, revoke_key, reopen, create_team, list_teams,
          update_team, delete_team]
