"""What a virtual key is allowed, resolved with its team: pure values and their rules.

A key's secret is shown once and never stored: the database keeps its SHA-256 (keys are 32
random bytes, so a plain digest is as strong as a slow one), a short prefix and the last four
characters. Budget periods are UTC calendar periods: a day from midnight, a week from Monday,
a month from the 1st; `total` never resets.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.core.limits import KeyLimits

Period = Literal["day", "week", "month", "total"]
PERIODS: tuple[Period, ...] = ("day", "week", "month", "total")
SECRET_PREFIX = "sk-llms-"
PREFIX_SHOWN = 12  # "sk-llms-" and four characters: enough to tell keys apart in a list
NANO = 1_000_000_000  # budgets are counted in nano-dollars, as integers, so sums are exact


def new_secret() -> str:
    """A fresh key: the prefix and 32 random bytes, URL-safe."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """What the database keeps of a key, and what a presented key is looked up by."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def nano(usd: float) -> int:
    """Dollars as the ledger counts them."""
    return round(usd * NANO)


def window(period: Period, now: float) -> tuple[float, float | None]:
    """The start of the budget period `now` falls in, and its end (None: `total`)."""
    if period == "total":
        return 0.0, None
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0,
                                                          microsecond=0)
    if period == "day":
        start, end = day, day + dt.timedelta(days=1)
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
        end = start + dt.timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (start + dt.timedelta(days=32)).replace(day=1)
    return start.timestamp(), end.timestamp()


@dataclass(frozen=True, slots=True)
class Budget:
    """Dollars a key or team may spend per period."""

    usd: float
    period: Period


@dataclass(frozen=True, slots=True)
class Scope:
    """One budget a request falls under: its key's or its team's."""

    kind: Literal["key", "team"]
    name: str  # the key's id or the team's name
    budget: Budget
    # Worked out once, not per request: where the ledger counts it, and its limit as it counts
    # (nano-dollars).
    id: str = field(init=False)
    limit: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.kind}:{self.name}")
        object.__setattr__(self, "limit", nano(self.budget.usd))

    @property
    def period(self) -> Period:
        """The period its count starts again with: its budget's."""
        return self.budget.period


@dataclass(frozen=True, slots=True)
class Slots:
    """A key's or a team's requests in flight (`max_parallel`), counted like a budget that
    never resets: each request holds one unit until it ends."""

    kind: Literal["key", "team"]
    name: str  # the key's id or the team's name
    limit: int  # its most at once
    id: str = field(init=False)
    period: Period = "total"

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.kind}:{self.name}:in-flight")


@dataclass(frozen=True, slots=True)
class Account:
    """A virtual key as the hot path reads it: who, which aliases, which limits and budgets."""

    key_id: str
    team: str | None
    models: frozenset[str] | None  # None: every alias
    limits: KeyLimits  # the key's own rpm and tpm
    team_limits: KeyLimits | None  # the team's, counted over all its keys
    scopes: tuple[Scope, ...]  # the key's budget, then its team's
    expires_at: float | None
    private: bool = False  # a virtual key's content may be traced (`telemetry`)
    # Each parallel limit set, the key's then its team's: a key under none is never counted.
    slots: tuple[Slots, ...] = ()
    # The guardrails of llms.json its requests pass besides their alias's: the key's and its
    # team's (`gateway.guardrails`).
    guardrails: tuple[str, ...] = ()
    capture: str | None = None  # what the request log keeps of its requests (its `logs`)
    # MCP tools it may call: each list (the key's, its team's) must match (`gateway.mcp`).
    mcp_tools: tuple[tuple[str, ...], ...] = ()

    def allows(self, alias: str) -> bool:
        """Whether the key may use `alias`."""
        return self.models is None or alias in self.models


def _models(key: Mapping[str, Any], team: Mapping[str, Any] | None) -> frozenset[str] | None:
    """The aliases both the key and its team allow (the stricter of the two)."""
    allowed = [frozenset(m) for m in (key.get("models"), team and team.get("models"))
               if m is not None]
    if not allowed:
        return None
    return frozenset.intersection(*allowed)


def _budget(row: Mapping[str, Any]) -> Budget | None:
    usd, period = row.get("budget_usd"), row.get("budget_period")
    return Budget(float(usd), period) if usd is not None and period in PERIODS else None


def account_of(key: Mapping[str, Any], team: Mapping[str, Any] | None) -> Account:
    """A key row and its team's row as the hot path reads them."""
    scopes = []
    if (own := _budget(key)) is not None:
        scopes.append(Scope("key", key["id"], own))
    if team is not None and (shared := _budget(team)) is not None:
        scopes.append(Scope("team", team["name"], shared))
    return Account(
        key_id=key["id"], team=team["name"] if team is not None else None,
        models=_models(key, team),
        limits=KeyLimits(key["id"], key.get("rpm"), key.get("tpm")),
        team_limits=KeyLimits(f"team:{team['name']}", team.get("rpm"), team.get("tpm"))
        if team is not None and (team.get("rpm") or team.get("tpm")) else None,
        scopes=tuple(scopes), expires_at=key.get("expires_at"),
        slots=_slots(key, team), capture=(key.get("logs") or {}).get("capture"),
        guardrails=tuple(dict.fromkeys([*(key.get("guardrails") or ()),
                                        *((team or {}).get("guardrails") or ())])),
        mcp_tools=tuple(tuple(found) for found in (key.get("mcp_tools"),
                                                   team and team.get("mcp_tools"))
                        if isinstance(found, list)))


def _slots(key: Mapping[str, Any], team: Mapping[str, Any] | None) -> tuple[Slots, ...]:
    slots = []
    if key.get("max_parallel") is not None:
        slots.append(Slots("key", key["id"], int(key["max_parallel"])))
    if team is not None and team.get("max_parallel") is not None:
        slots.append(Slots("team", team["name"], int(team["max_parallel"])))
    return tuple(slots)
