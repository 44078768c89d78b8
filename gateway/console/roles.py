"""Who a signed-in person is to the console, from their ID token's claims (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.accounts.sessions import Role
from gateway.core.settings.console import OidcRoles


def groups(claims: Mapping[str, Any], claim: str) -> list[str]:
    """The groups (or roles) a claim lists: a list of strings, or one string."""
    raw = claims.get(claim)
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list):
        return [g for g in raw if isinstance(g, str)]
    return []


def role_of(claims: Mapping[str, Any], roles: OidcRoles) -> tuple[Role, tuple[str, ...]] | None:
    """The console role and, for a team admin, their teams; None for someone no role names.
    The widest wins: admin, then viewer (reads all), then team admin (their teams)."""
    found = set(groups(claims, roles.claim))
    if found & set(roles.admin):
        return "admin", ()
    if found & set(roles.viewer):
        return "viewer", ()
    teams = tuple(sorted({team for group, team in roles.team_admin.items() if group in found}))
    if teams:
        return "team_admin", teams
    return None


def actor_of(claims: Mapping[str, Any]) -> str:
    """The audit log's name for the person: their email, else their subject (also when the
    issuer says the email is not verified: anyone could have typed it)."""
    email = claims.get("email")
    if isinstance(email, str) and email.strip() and claims.get("email_verified") is not False:
        return email.strip()[:128]
    return str(claims["sub"])[:128]
