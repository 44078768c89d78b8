"""What the console serves besides JSON: its static files, its error pages, its cookies, and
the headers that keep its pages to themselves (pure)."""

from __future__ import annotations

import html
from pathlib import Path

from litestar.datastructures import Cookie

from gateway.edge.access import COOKIE, SECURE_COOKIE

STATIC = Path(__file__).parent.parent / "static" / "console"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
# Read once: the console is a handful of small files, no build step, nothing from a CDN.
ASSETS = {path.name: (path.read_bytes(), TYPES[path.suffix])
          for path in sorted(STATIC.iterdir()) if path.suffix in TYPES}
FLOW_COOKIE = "llms_console_flow"
FLOW_PATH = "/ui/callback"
FLOW_LIFETIME = 600  # seconds a sign-in may take at the issuer

# Scripts and styles from this gateway only, never inline; no frame may hold the console; the
# address (a sign-in's `code`) never leaves in a Referer.
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
                               "form-action 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


def page(title: str, message: str) -> bytes:
    """A small HTML page saying why (every word escaped), with a way back to the console."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{html.escape(title)}</title>'
            f'<link rel="stylesheet" href="/ui/static/console.css"></head>'
            f'<body class="refused"><main><h1>{html.escape(title)}</h1>'
            f'<p id="why">{html.escape(message)}</p>'
            f'<p><a href="/ui">Back to the console</a></p></main></body></html>').encode()


def session_cookie(token: str, secure: bool, lifetime: float) -> Cookie:
    """The session's cookie: HttpOnly (no script reads it), SameSite=Lax (no other site's
    POST carries it), this host only; `__Host-` and Secure over https."""
    return Cookie(key=SECURE_COOKIE if secure else COOKIE, value=token, path="/",
                  max_age=int(lifetime), httponly=True, secure=secure, samesite="lax")


def ended_cookies() -> list[Cookie]:
    """Both spellings of the session cookie, expired."""
    return [Cookie(key=COOKIE, value="", path="/", max_age=0, httponly=True, samesite="lax"),
            Cookie(key=SECURE_COOKIE, value="", path="/", max_age=0, httponly=True,
                   secure=True, samesite="lax")]


def flow_cookie(value: str, secure: bool) -> Cookie:
    """A sign-in under way (state, nonce, PKCE verifier): sent back to the callback only."""
    return Cookie(key=FLOW_COOKIE, value=value, path=FLOW_PATH, max_age=FLOW_LIFETIME,
                  httponly=True, secure=secure, samesite="lax")


def flow_ended(secure: bool) -> Cookie:
    return Cookie(key=FLOW_COOKIE, value="", path=FLOW_PATH, max_age=0, httponly=True,
                  secure=secure, samesite="lax")
