"""Admin endpoints: list providers, enable or disable one at live, and the config in force.

They need an admin key (`server.admin_keys`), or a console session (`gateway.edge.access`);
with no admin key configured they answer only requests from this machine that no proxy
forwarded (`gateway.accounts.auth.check_admin`).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, post

from gateway.edge import status_page
from gateway.edge.access import caller
from gateway.edge.config_view import hidden
from gateway.edge.status_page import providers_view
from gateway.state.runtime import Runtime
from providers.contract.errors import NotFound

JSON = "application/json"


def _json(runtime: Runtime, body: Any) -> Response[bytes]:
    return Response(status_page.encoded(runtime, body), media_type=JSON)


@get("/admin/providers")
async def list_providers(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Providers in file order with state, models and circuits."""
    await caller(request)
    runtime: Runtime = request.app.state.runtime
    return _json(runtime, {"providers": providers_view(runtime)})


@post("/admin/providers/{name:str}/{action:str}", status_code=200)
async def toggle_provider(request: Request[Any, Any, Any], name: str,
                          action: str) -> Response[bytes]:
    """`enable` or `disable` a provider; routing changes with the next request."""
    actor = (await caller(request)).actor
    runtime: Runtime = request.app.state.runtime
    if action not in ("enable", "disable"):
        raise NotFound(f"No admin action '{action}': use enable or disable")
    if name not in {spec.name for spec in runtime.live.snapshot.providers}:
        raise NotFound(f"No provider named '{name}'")
    await runtime.set_enabled(name, action == "enable")
    if runtime.accounts is not None:
        await runtime.accounts.audit(actor, f"provider_{action}d", name)
    row = next(p for p in providers_view(runtime) if p["name"] == name)
    return _json(runtime, row)


@get("/admin/config")
async def config_in_force(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The llms.json in force (the last that loaded, not the file if a reload failed), every
    secret hidden: credentials by their field, and any configured secret wherever it is."""
    await caller(request)
    runtime: Runtime = request.app.state.runtime
    snapshot = runtime.live.snapshot
    return _json(runtime, {"source": str(snapshot.source) if snapshot.source else None,
                           "last_reload_error": runtime.config_error,
                           "config": hidden(snapshot.document)})
