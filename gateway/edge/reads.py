"""The read routes: models, metrics, the status page and its JSON, the OpenAPI document,
liveness and readiness. Each that names what a key may see reads it through `auth`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from litestar import Request, Response, get

from gateway.accounts import auth
from gateway.accounts.account import Account
from gateway.core.errors import ModelNotAllowed
from gateway.core.settings import GatewayKey, Snapshot
from gateway.edge import openapi, status_page
from gateway.edge.access import session_of
from gateway.observe.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.routing import router
from gateway.state.runtime import Runtime, model_card
from providers.contract.errors import GatewayError

JSON = "application/json"


STATUS_PAGE = (Path(__file__).parent.parent / "static" / "status.html").read_bytes()


OPENAPI = msgspec.json.encode(openapi.document())


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Every alias served by an enabled provider; for a key limited to some, those."""
    runtime, key = await _reader(request, "/v1/models")
    limited = key.models if isinstance(key, Account) else None
    if limited is None:
        return Response(runtime.live.models_body, media_type=JSON)
    listed = msgspec.json.decode(runtime.live.models_body)
    listed["data"] = [card for card in listed["data"]
                      if _allowed(runtime.live.snapshot, card["id"], limited)]
    return Response(msgspec.json.encode(listed), media_type=JSON)


def _allowed(snapshot: Snapshot, name: str, limited: frozenset[str]) -> bool:
    try:
        return snapshot.resolve(name) in limited
    except GatewayError:
        return False


@get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request[Any, Any, Any], model_id: str) -> Response[bytes]:
    """One alias, or a name that serves as one (`alias_of`, a pattern); else 404
    model_not_found (403 model_not_allowed for a key limited to other aliases, known or not)."""
    runtime, key = await _reader(request, "/v1/models")
    live = runtime.live
    alias = model_id.lstrip("/")
    if isinstance(key, Account) and (limited := key.models) is not None \
            and not _allowed(live.snapshot, alias, limited):
        raise ModelNotAllowed(f"This key may not use the model '{alias[:200]}'", param="model")
    routes = router.candidates(live.snapshot, live.snapshot.resolve(alias))
    card = model_card(alias, routes[0].provider, int(_runtime(request).started))
    return Response(msgspec.json.encode(card), media_type=JSON)


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text format, every worker's when there are several; the series labelled by
    key (their ids) only to an admin, or on a gateway without keys."""
    runtime, key = await _reader(request, "/metrics")
    every_key = _sees_every_key(request, runtime, key)
    return Response(runtime.metrics.exposition(keys=every_key),
                    media_type=METRICS_CONTENT_TYPE)


@get("/")
async def status_html() -> Response[bytes]:
    """The status page: plain HTML and a small script, no build step, works offline."""
    return Response(STATUS_PAGE, media_type="text/html")


@get("/status.json")
async def status_json(request: Request[Any, Any, Any]) -> Response[bytes]:
    """What the status page shows, refreshed every two seconds. Other keys' ids and spend
    only to an admin (`auth.is_admin`), or on a gateway without keys: another key sees its own
    place in the queue and no spend. A console session reads it as an admin key would,
    unless it is a team admin's (their team's spend is in `/admin/spend`)."""
    session = None if auth.presented_key(request.headers) else await session_of(request)
    if session is not None and session.role != "team_admin":
        runtime, key, every_key = _runtime(request), None, True
    else:
        runtime, key = await _reader(request, "/status.json")
        every_key = _sees_every_key(request, runtime, key)
    body = status_page.status(runtime, every_key, _id_of(key))
    body.update(await status_page.accounts_view(runtime, request.app.state.spend, every_key))
    body["request_log"] = request.app.state.journal.status()
    if (hub := getattr(request.app.state, "mcp", None)) is not None:
        body["mcp_servers"] = hub.view()  # each upstream MCP server's state and tools
    return _json(runtime, body)


@get("/openapi.json")
async def openapi_document() -> Response[bytes]:
    """The relay routes' OpenAPI document (their request bodies as the gateway checks them)."""
    return Response(OPENAPI, media_type=JSON)


@get("/health")
async def health() -> Response[bytes]:
    """Liveness: the process answers. No upstream is called."""
    return Response(b'{"status":"ok"}', media_type=JSON)


@get("/ready")
async def ready(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Readiness: a config is loaded, a provider is enabled, and every pool model can answer
    (`loading` lists those that cannot yet). Providers, circuits and load are listed only for
    a request with a valid key, or to anyone on a gateway without keys; a key presented must
    be valid even here (`auth.identify`), so an expired one is refused as everywhere."""
    runtime = _runtime(request)
    snapshot = runtime.live.snapshot
    key = await auth.admitted(request.headers, snapshot, runtime.accounts, reading=True,
                              public=True)
    is_ready = any(p.enabled for p in snapshot.providers)
    loading = sorted({alias for provider in runtime.live.providers.values()
                      for alias in provider.loading_models()})
    body: dict[str, Any] = {"status": "ready" if is_ready and not loading else "not_ready"}
    if not is_ready:
        body["reason"] = "no provider is enabled"
    elif loading:
        body["reason"] = "pool models are still loading"
        body["loading"] = loading
        is_ready = False
    if key is not None or not auth.keyed(snapshot, runtime.accounts):
        live = runtime.live.providers
        body["providers"] = [
            {"name": p.name, "type": p.kind, "enabled": p.enabled, "reason": p.disabled_reason,
             **({"state": state} if p.name in live and (state := live[p.name].live_state())
                else {})}
            for p in snapshot.providers]
        body["inflight"] = runtime.inflight
        body["circuits"] = runtime.health.snapshot()
    return _json(runtime, body, 200 if is_ready else 503)


def _runtime(request: Request[Any, Any, Any]) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _json(runtime: Runtime, body: Any, status: int = 200) -> Response[bytes]:
    """A JSON answer about the gateway's state (it quotes upstream messages): redacted."""
    return Response(status_page.encoded(runtime, body), media_type=JSON, status_code=status)


async def _reader(request: Request[Any, Any, Any], path: str
                  ) -> tuple[Runtime, GatewayKey | Account | None]:
    """The runtime and the caller's key, for a request allowed to read `path` (a key, or
    anyone on a public path; a key presented there is checked all the same)."""
    runtime = _runtime(request)
    snapshot = runtime.live.snapshot
    key = await auth.admitted(request.headers, snapshot, runtime.accounts, reading=True,
                              public=path in snapshot.server.public_paths)
    return runtime, key


def _sees_every_key(request: Request[Any, Any, Any], runtime: Runtime,
                    key: GatewayKey | Account | None) -> bool:
    """Whether the caller may read other keys' ids and spend: an admin, or anyone on a
    gateway without keys (there is no other key)."""
    snapshot = runtime.live.snapshot
    return not auth.keyed(snapshot, runtime.accounts) or auth.is_admin(
        key, snapshot, request.headers, request.client.host if request.client else "")


def _id_of(key: GatewayKey | Account | None) -> str | None:
    return key.limits.key_id if key is not None else None


ROUTES = (list_models, retrieve_model, health, ready, metrics, status_html, status_json,
          openapi_document)
