"""The console's routes: its page and files, who is signed in, and signing in and out.

Sign-in by single sign-on: `/ui/login` sends the browser to the issuer with a fresh `state`,
`nonce` and PKCE challenge (kept in a cookie only the callback receives); `/ui/callback` checks
the `state`, exchanges the code, verifies the ID token (`gateway.console.oidc`), maps its
groups to a role (`gateway.console.roles`) and opens a session; any failure is a 401 page, a
person with no role a 403 page, neither a session. Sign-in with an admin key: the key is POSTed
once, in a JSON body (never a URL), and only the session's cookie is kept. After sign-in the
browser always lands on `/ui`: no address from the request is followed.
"""

from __future__ import annotations

import hmac
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Redirect

from gateway.accounts import auth
from gateway.accounts.sessions import Session, Sessions
from gateway.console import pages
from gateway.console.oidc import Flow, Issuer, LoginRefused
from gateway.console.roles import actor_of, role_of
from gateway.core.errors import AuthenticationFailed, PermissionDenied
from gateway.core.settings import Snapshot
from gateway.core.settings.console import OidcConfig
from gateway.edge.access import CSRF_HEADER, cookie_token, session_of
from gateway.state.runtime import Runtime
from providers.contract.errors import InvalidRequest, NotFound
from providers.contract.log import get_logger

JSON = "application/json"


class KeyLogin(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str


class Issuers:
    """This process's issuer for the config in force (its endpoints and keys kept between
    sign-ins), made again when `ui.oidc` changes."""

    def __init__(self) -> None:
        self._current: tuple[OidcConfig, Issuer] | None = None

    def of(self, config: OidcConfig) -> Issuer:
        if self._current is None or self._current[0] != config:
            self._current = (config, Issuer(config))
        return self._current[1]


def _snapshot(request: Request[Any, Any, Any]) -> Snapshot:
    runtime: Runtime = request.app.state.runtime
    return runtime.live.snapshot


def _sessions(request: Request[Any, Any, Any]) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def _secure(request: Request[Any, Any, Any]) -> bool:
    return request.url.scheme == "https"


def _page(status: int, title: str, message: str, **extra: Any) -> Response[bytes]:
    return Response(pages.page(title, message), status_code=status,
                    media_type="text/html; charset=utf-8", headers=pages.HEADERS, **extra)


@get("/ui")
async def console() -> Response[bytes]:
    """The console: one page and its modules, no build step, nothing from elsewhere."""
    body, media = pages.ASSETS["index.html"]
    return Response(body, media_type=media, headers=pages.HEADERS)


@get("/ui/static/{name:str}")
async def asset(name: str) -> Response[bytes]:
    """One of the console's files, by name (nothing else on disk is reachable)."""
    if name not in pages.ASSETS or name == "index.html":
        raise NotFound(f"No console file '{name[:64]}'")
    body, media = pages.ASSETS[name]
    return Response(body, media_type=media, headers=pages.HEADERS)


def _local_admin(request: Request[Any, Any, Any], snapshot: Snapshot) -> bool:
    """No admin key and no sign-on configured: this machine is the admin, as the admin API
    says (`auth.check_admin`)."""
    return not snapshot.admin_keys and snapshot.ui.oidc is None and auth.is_local(
        request.client.host if request.client else "") and not any(
        h in request.headers for h in auth.FORWARDING_HEADERS)


@get("/ui/session")
async def whoami(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Who is signed in (and the CSRF token their writes carry), and how one signs in."""
    snapshot = _snapshot(request)
    ways = {"sso": snapshot.ui.oidc is not None,
            "key_login": snapshot.ui.key_login and bool(snapshot.admin_keys)}
    session = await session_of(request)
    if session is not None:
        body = {"signed_in": True, "actor": session.actor, "role": session.role,
                "teams": list(session.teams), "csrf": session.csrf, "via": session.via}
    elif _local_admin(request, snapshot):
        body = {"signed_in": True, "actor": auth.LOCAL_ADMIN, "role": "admin", "teams": [],
                "csrf": None, "via": "local"}
    else:
        body = {"signed_in": False}
    return Response(msgspec.json.encode({**body, **ways}), media_type=JSON,
                    headers={"cache-control": "no-store"})


@post("/ui/login/key", status_code=200)
async def key_login(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Sign in with an admin key (`ui.key_login`): a session in its name, the key not kept."""
    snapshot = _snapshot(request)
    if not snapshot.ui.key_login:
        raise PermissionDenied("Signing in to the console with a key is turned off "
                               "(ui.key_login): use single sign-on")
    try:
        key = msgspec.json.decode(await request.body(), type=KeyLogin).key.strip()
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise InvalidRequest('Send {"key": "<admin key>"}', param="key") from None
    matched = next((a for a in snapshot.admin_keys
                    if hmac.compare_digest(key.encode(), a.secret.reveal().encode())), None)
    if matched is None:
        raise AuthenticationFailed("Not an admin key of this gateway (server.admin_keys)")
    return await _opened(request, matched.limits.key_id, "admin", (), "key")


async def _opened(request: Request[Any, Any, Any], actor: str, role: Any,
                  teams: tuple[str, ...], via: str, redirect: bool = False) -> Response[Any]:
    lifetime = _snapshot(request).ui.session_hours * 3600
    token, session = await _sessions(request).open(actor, role, teams, via, lifetime)
    get_logger().info("console_signed_in", actor=actor, role=role, via=via)
    cookies = [pages.session_cookie(token, _secure(request), lifetime)]
    if redirect:
        cookies.append(pages.flow_ended(_secure(request)))
        return Redirect("/ui", status_code=303, cookies=cookies, headers=pages.HEADERS)
    return Response(msgspec.json.encode(_view(session)), media_type=JSON, cookies=cookies)


def _view(session: Session) -> dict[str, Any]:
    return {"signed_in": True, "actor": session.actor, "role": session.role,
            "teams": list(session.teams), "csrf": session.csrf, "via": session.via}


@post("/ui/logout", status_code=200)
async def logout(request: Request[Any, Any, Any]) -> Response[bytes]:
    """End this session everywhere (every worker reads the same row) and drop its cookie."""
    token, session = cookie_token(request), await session_of(request)
    if token is not None and session is not None:
        if not hmac.compare_digest(request.headers.get(CSRF_HEADER, "").encode(),
                                   session.csrf.encode()):
            raise PermissionDenied(f"Signing out needs the session's CSRF token in "
                                   f"{CSRF_HEADER}")
        await _sessions(request).end(token)
        get_logger().info("console_signed_out", actor=session.actor)
    return Response(b'{"signed_in":false}', media_type=JSON, cookies=pages.ended_cookies())


def _issuer(request: Request[Any, Any, Any]) -> tuple[Issuer, str]:
    oidc = _snapshot(request).ui.oidc
    if oidc is None:
        raise NotFound("Single sign-on is not configured (ui.oidc)")
    issuers: Issuers = request.app.state.issuers
    redirect = oidc.redirect_uri or f"{str(request.base_url).rstrip('/')}{pages.FLOW_PATH}"
    return issuers.of(oidc), redirect


@get("/ui/login")
async def sso_login(request: Request[Any, Any, Any]) -> Response[Any]:
    """Off to the issuer to sign in; the flow's secrets stay in a cookie for the callback."""
    issuer, redirect = _issuer(request)
    flow = Flow.new()
    try:
        target = await issuer.authorization_url(flow, redirect)
    except LoginRefused as refused:
        return _page(502, "Single sign-on is unavailable", str(refused))
    value = f"{flow.state}.{flow.nonce}.{flow.verifier}"
    return Redirect(target, status_code=303, headers=pages.HEADERS,
                    cookies=[pages.flow_cookie(value, _secure(request))])


@get("/ui/callback")
async def callback(request: Request[Any, Any, Any]) -> Response[Any]:
    """The issuer sends the browser back here with a code: a session, or a page saying no."""
    issuer, redirect = _issuer(request)
    ended = {"cookies": [pages.flow_ended(_secure(request))]}
    params = request.query_params
    parts = request.cookies.get(pages.FLOW_COOKIE, "").split(".")
    if len(parts) != 3 or not hmac.compare_digest(params.get("state", "").encode(),
                                                  parts[0].encode()):
        return _page(401, "Sign-in refused", "The sign-in's state does not match the one this "
                     "browser started (forged, replayed or expired): sign in again", **ended)
    flow = Flow(*parts)
    if "error" in params or "code" not in params:
        said = params.get("error_description") or params.get("error") or "no code"
        return _page(401, "Sign-in refused", f"The issuer said: {said[:300]}", **ended)
    try:
        claims = await issuer.verify(await issuer.exchange(params["code"], flow, redirect),
                                     flow)
    except LoginRefused as refused:
        get_logger().info("console_sign_in_refused", reason=str(refused))
        return _page(401, "Sign-in refused", str(refused), **ended)
    role = role_of(claims, issuer.config.roles)
    actor = actor_of(claims)
    if role is None:
        get_logger().info("console_sign_in_refused", actor=actor, reason="no role")
        return _page(403, "No access", f"{actor} is signed in at the issuer, but no group of "
                     "theirs is given a role in this gateway's console (ui.oidc.roles)",
                     **ended)
    return await _opened(request, actor, role[0], role[1], "oidc", redirect=True)


ROUTES = [console, asset, whoami, key_login, logout, sso_login, callback]
