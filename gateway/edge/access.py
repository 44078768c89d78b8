"""Who calls an admin route: an admin key (as ever), or a person signed in to the console.

A console session is a cookie (`gateway.console` sets it) naming a row of the accounts
database (`gateway.accounts.sessions`), read on every request, so a sign-out holds on every
worker at once. A key presented wins over a cookie. A write from a session needs the session's
CSRF token in `x-csrf-token` (a page elsewhere cannot read it); a `viewer` reads everything and
writes nothing; a `team_admin` reaches only the routes that scope to a team, and only their own
teams there.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgspec
from litestar import Request

from gateway.accounts import auth
from gateway.accounts.sessions import Role, Session, Sessions
from gateway.core.errors import AuthenticationFailed, PermissionDenied

COOKIE = "llms_console"
SECURE_COOKIE = "__Host-llms_console"  # over https: no Domain, Path=/, Secure, by its name
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))


class Caller(msgspec.Struct, frozen=True):
    """Who acts on an admin route, and the audit log's name for them."""

    actor: str
    role: Role
    teams: tuple[str, ...] = ()
    session: Session | None = None

    def owns(self, team: str | None) -> bool:
        """Whether this caller may reach what belongs to `team` (a team admin: theirs only)."""
        return self.role != "team_admin" or (team is not None and team in self.teams)


def cookie_token(request: Request[Any, Any, Any]) -> str | None:
    """The console session's token the browser sent, if any."""
    cookies = request.cookies
    return cookies.get(SECURE_COOKIE) or cookies.get(COOKIE) or None


async def session_of(request: Request[Any, Any, Any]) -> Session | None:
    """The live console session of this request's cookie, or None."""
    token = cookie_token(request)
    sessions: Sessions | None = getattr(request.app.state, "sessions", None)
    if token is None or sessions is None:
        return None
    return await sessions.find(token)


async def caller(request: Request[Any, Any, Any], *, team_scoped: bool = False) -> Caller:
    """The caller of an admin route (401 or 403 as `auth.check_admin`, and for sessions as
    the module says); `team_scoped` routes admit a team admin, who then sees their teams' only."""
    runtime = request.app.state.runtime
    if auth.presented_key(request.headers) is None and cookie_token(request) is not None:
        session = await session_of(request)
        if session is None:
            raise AuthenticationFailed("The console session ended or expired: sign in again")
        if request.method not in SAFE_METHODS:
            sent = request.headers.get(CSRF_HEADER, "").encode()
            if not hmac.compare_digest(sent, session.csrf.encode()):
                raise PermissionDenied("A change from a console session needs its CSRF token "
                                       f"in {CSRF_HEADER}")
            if session.role == "viewer":
                raise PermissionDenied("A viewer may read but not change anything")
        if session.role == "team_admin" and not team_scoped:
            raise PermissionDenied("A team admin reaches their own team's keys, spend and "
                                   "logs only")
        return Caller(session.actor, session.role, session.teams, session)
    actor = auth.check_admin(request.headers, runtime.live.snapshot,
                             request.client.host if request.client else "", runtime.accounts)
    return Caller(actor, "admin")


def own_team(who: Caller, team: str | None) -> None:
    """403 unless `who` may act for `team`."""
    if not who.owns(team):
        raise PermissionDenied(f"A team admin acts for {', '.join(who.teams)} only",
                               param="team")
