"""`/mcp` and `/mcp/{server}`: the MCP gateway over streamable HTTP, served as plain ASGI.

Every request is a key's (`auth.admitted`, the door of every keyed route); without one the
answer is 401 with `WWW-Authenticate: Bearer resource_metadata=…`, the document at
`/.well-known/oauth-protected-resource` (and under it, per MCP path) describing the gateway.
A POST carries one JSON-RPC message: a 2026-07-28 request is checked by the SDK's envelope
ladder (`classify_inbound_request`) and answered alone; a 2025-11-25 client's `initialize`
opens a session (`gateway.mcp.sessions`, any replica serves it), its other requests name it
in `Mcp-Session-Id`, and `DELETE` ends it. A tool call is answered as SSE when the client
accepts it (its progress relayed as it comes), JSON otherwise; a client that leaves cancels
the call, and the upstream hears it at once. Everything that leaves is redacted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from litestar import Litestar
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

PREFIX = "/mcp"
WELL_KNOWN = "/.well-known/oauth-protected-resource"
JSON = b"application/json"


class McpRoute:
    """An ASGI app: the MCP paths here, everything else to `inner`."""

    def __init__(self, inner: ASGIApp, app: Litestar) -> None:
        self.inner = inner
        self.app = app
        self._serve: Callable[..., Awaitable[None]] | None = None  # `mcp_exchange.serve`

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == ScopeType.HTTP else ""
        described = path.removeprefix(WELL_KNOWN) if path.startswith(WELL_KNOWN) else None
        if described in ("", PREFIX) or (described or "").startswith(PREFIX + "/"):
            await reply(send, 200, _resource(scope, described or PREFIX))
            return
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            await self.inner(scope, receive, send)
            return
        # Read as items: as attributes, each is found only after an AttributeError.
        state = self.app.state
        hub = state["mcp"]
        await hub.loaded()  # the SDK, imported once, off the event loop
        serve = self._serve
        if serve is None:  # imported at the first request (an import per call costs too)
            from gateway.edge.mcp_exchange import serve as imported

            serve = self._serve = imported
        await serve(scope, receive, send, state["runtime"], hub, state["mcp_sessions"],
                    state["mcp_cancels"], path)


def base_url(scope: Scope) -> str:
    """This gateway's URL as the client reached it."""
    headers = dict(scope.get("headers", ()))
    host = headers.get(b"host", b"localhost").decode("latin-1")
    return f"{scope.get('scheme', 'http')}://{host}"


def _resource(scope: Scope, path: str) -> dict[str, Any]:
    """RFC 9728's protected-resource metadata of the MCP path `path`."""
    return {"resource": base_url(scope) + path, "authorization_servers": [],
            "bearer_methods_supported": ["header"], "resource_name": "llms-gateway MCP",
            "resource_documentation": "docs/mcp.md"}


async def reply(send: Send, status: int, payload: dict[str, Any] | None,
                headers: dict[str, str] | None = None, redact: Any = None) -> None:
    """A whole answer: `payload` as JSON (none: an empty body), redacted by `redact`'s live
    redactor when given (a `Runtime`)."""
    body = b"" if payload is None else msgspec.json.encode(payload)
    if redact is not None:
        body = redact.live.redactor.encoded(body)
    head = [(b"content-length", b"%d" % len(body))]
    if payload is not None:
        head.append((b"content-type", JSON))
    head += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})
