"""Admin endpoints: list providers, enable or disable one at live.

They need an admin key (`server.admin_keys`); with none configured they answer only requests
from this machine that no proxy forwarded (`gateway.auth.check_admin`).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, post

from gateway import auth, status_page
from gateway.services import Services
from gateway.status_page import providers_view
from providers.contract.errors import NotFound

JSON = "application/json"


def _authorized(request: Request[Any, Any, Any]) -> Services:
    services: Services = request.app.state.services
    auth.check_admin(request.headers, services.live.snapshot,
                     request.client.host if request.client else "")
    return services


def _json(services: Services, body: Any) -> Response[bytes]:
    return Response(status_page.encoded(services, body), media_type=JSON)


@get("/admin/providers")
async def list_providers(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Providers in file order with state, models and circuits."""
    services = _authorized(request)
    return _json(services, {"providers": providers_view(services)})


@post("/admin/providers/{name:str}/{action:str}", status_code=200)
async def toggle_provider(request: Request[Any, Any, Any], name: str,
                          action: str) -> Response[bytes]:
    """`enable` or `disable` a provider; routing changes with the next request."""
    services = _authorized(request)
    if action not in ("enable", "disable"):
        raise NotFound(f"No admin action '{action}': use enable or disable")
    if name not in {spec.name for spec in services.live.snapshot.providers}:
        raise NotFound(f"No provider named '{name}'")
    await services.set_enabled(name, action == "enable")
    row = next(p for p in providers_view(services) if p["name"] == name)
    return _json(services, row)
