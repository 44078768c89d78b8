"""The HTTP surface: Litestar routes, the lifespan that owns the transport, one envelope.

`create_app()` is the ASGI server's factory (one per worker process): it reads the config named
by `$LLMS_CONFIG` (the CLI sets it) or found by discovery. The relay routes are served by
`gateway.edge.front` in front of Litestar (the data plane skips the framework); Litestar serves
everything else: models, admin, status, health, metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.handlers import HTTPRouteHandler
from litestar.types import ASGIApp

import providers
from gateway import config
from gateway.accounts.database import IN_MEMORY, Database
from gateway.accounts.file_ledger import FileLedger
from gateway.accounts.ledger import RedisLedger
from gateway.accounts.overview import Overview
from gateway.accounts.service import Accounts
from gateway.accounts.sessions import Sessions
from gateway.adapters.responses.store import ResponseStore
from gateway.batches import routes as batch_routes
from gateway.batches.runner import Runner
from gateway.batches.store import Store
from gateway.cache.semantic_store import SemanticStore
from gateway.cache.store import ResponseCache
from gateway.config.loader import BIND_ENV, WORKERS_ENV, state_dir
from gateway.console import routes as console
from gateway.core.errors import MethodNotAllowed, RequestTooLarge
from gateway.core.record import request_id
from gateway.core.settings import CachePolicy, Snapshot
from gateway.edge import (
    admin,
    admin_accounts,
    admin_logs,
    admin_reports,
    reads,
    realtime,
    stored_responses,
)
from gateway.edge.front import Front
from gateway.edge.guard import Limits
from gateway.edge.mcp_route import McpRoute
from gateway.edge.origins import Origins
from gateway.idempotency.store import IdempotencyStore
from gateway.mcp import sessions as mcp_sessions
from gateway.mcp.cancels import Cancels
from gateway.mcp.hub import Hub
from gateway.observe import logs
from gateway.pipeline import stack
from gateway.realtime.limits import SessionCounts
from gateway.requestlog.journal import Journal
from gateway.requestlog.store import Store as LogStore
from gateway.state import discovery, reload
from gateway.state.redis_sync import RedisSync, redis_client
from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError, InvalidRequest, NotFound, error_body
from providers.contract.log import get_logger
from providers.contract.transport import Transport
from providers.transport import AiohttpTransport

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from gateway.observe.tracing import Tracing

# What a browser's script may read of an answer besides the CORS-safelisted headers.
EXPOSED_HEADERS = ("x-request-id", "x-llms-provider", "x-llms-model", "x-llms-attempts",
                   "x-llms-cost", "x-llms-cache", "x-llms-cache-similarity", "x-llms-hedged",
                   "x-llms-overhead-ms",
                   "retry-after", *(f"x-ratelimit-{what}-{kind}"
                                    for what in ("limit", "remaining", "reset")
                                    for kind in ("requests", "tokens")))
# The collector's thresholds: (young objects between collections, young collections per
# middle one, middle collections per full one). Request paths leave no cycles (a test checks),
# so collections find nothing and their cost is what they traverse: what lives longer than a
# few ms, i.e. open streams. Young collections are kept small and middle ones frequent (a
# full one as rarely as Python's default: 2 x 500 = 20 x 50), so thousands of open streams
# never pause the loop for long (the pauses measured are in docs/benchmarks.md, GC probe).
GC_THRESHOLDS = (2_000, 2, 500)


def _error_response(request: Request[Any, Any, Any], error: GatewayError, status: int,
                    headers: dict[str, str] | None = None) -> Response[bytes]:
    headers = {**error.headers(), **(headers or {}),
               "x-request-id": request_id(request.headers)}
    body = error_body(error)
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        body = runtime.live.redactor.encoded(body)
    return Response(body, status_code=status, media_type=reads.JSON, headers=headers)


def on_gateway_error(request: Request[Any, Any, Any], exc: GatewayError) -> Response[bytes]:
    """Any GatewayError raised outside the relay path leaves as the envelope."""
    return _error_response(request, exc, exc.status)


def on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    """Litestar's own errors (no route, wrong method, body too large) in our envelope."""
    error: GatewayError
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        error = NotFound(f"No route for {request.method} {request.url.path}")
    elif exc.status_code == 405:
        error = MethodNotAllowed(f"Method {request.method} not allowed for {request.url.path}")
    elif exc.status_code == 413:
        error = RequestTooLarge("Request body is larger than the gateway accepts")
    elif exc.status_code == 400:
        error = InvalidRequest(str(exc.detail))
    else:
        return _error_response(request, GatewayError(str(exc.detail)), exc.status_code, headers)
    return _error_response(request, error, error.status, headers)


def on_unexpected_error(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """A bug: log it with its traceback, answer 500 in the envelope without details."""
    get_logger().exception("unhandled_error", path=request.url.path)
    return _error_response(request, GatewayError("Internal gateway error"), 500)


def _on_sighup() -> asyncio.Event:
    """An event SIGHUP sets: the daemon convention, reload the config (the default action
    would end this worker and cut its streams)."""
    heard = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not main thread
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, heard.set)
    return heard


@contextlib.asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    """Own the process's one upstream transport, its one Redis client (with the Redis state
    backend), the live config, and the reload watcher.

    Every upstream call (relayed requests, discovery, pool workers' health checks) goes through
    the transport; every Redis call (shared state, response cache, Responses store) through the
    client. The runtime is built whole here, before it serves, and both are closed, with their
    kept connections, when the app stops."""
    snapshot: Snapshot = app.state.initial
    state, cache_policy = snapshot.state, snapshot.default_policy.cache  # sized once, at start
    tracing = _tracing(snapshot)
    async with _upstream(tracing) as transport, redis_client(state) as redis:
        cache = _cache(cache_policy, redis, state.prefix, tracing)
        responses = ResponseStore(snapshot.responses.store_max_bytes,
                                  snapshot.responses.store_max_entry_bytes, redis, state.prefix)
        remembered = snapshot.idempotency
        idempotency = IdempotencyStore(remembered.max_bytes, remembered.max_entry_bytes, redis,
                                       state.prefix, lease=remembered.lease)
        ledger = RedisLedger(redis, state.prefix) if redis is not None else None
        machine = _machine_ledger(snapshot) if ledger is None else None
        accounts = Accounts(Database(snapshot.database.url or IN_MEMORY), snapshot.database,
                            lambda provider, alias: runtime.price_of(provider, alias),
                            lambda alias, provider: runtime.route_of(alias, provider),
                            ledger or machine, alone=_alone(snapshot, redis))
        await accounts.start()
        app.state.spend = Overview(accounts)  # the status page's spend, read every 10 s at most
        app.state.journal = journal = Journal(
            LogStore(accounts.db.engine), lambda: runtime.live.snapshot.logs,
            lambda: runtime.live.redactor,
            lambda alias, provider: runtime.route_of(alias, provider),
            accounts.cost, snapshot.database.flush_interval)
        app.state.sessions = Sessions(accounts.db)  # the console's sign-ins
        runtime = Runtime(transport, providers.load_kinds(), app.state.request_log,
                          cache=cache, responses=responses, redis=redis, tracing=tracing,
                          idempotency=idempotency, accounts=accounts, stacks=stack.stacks,
                          semantic=SemanticStore(cache_policy.max_bytes,
                                                 cache_policy.max_entry_bytes,
                                                 cache_policy.max_entries, redis, state.prefix),
                          journal=journal.ended)
        await runtime.apply(snapshot)
        app.state.runtime = runtime
        app.state.realtime = SessionCounts()  # the Realtime sessions open, per key
        app.state.batches = batches = Runner(Store(accounts.db.engine), runtime)
        # Upstream MCP servers behind `/mcp` (`gateway.mcp`), kept in step with reloads.
        app.state.mcp = hub = Hub(runtime)
        runtime.tools = hub  # the Responses API's `mcp` tools run through it too
        app.state.mcp_sessions = mcp_sessions.Sessions(
            redis, state.prefix, snapshot.mcp.max_sessions, snapshot.mcp.session_ttl)
        supervisor = runtime.supervisor
        app.state.mcp_cancels = Cancels(redis, state.prefix, supervisor.start)
        runtime.drain.listen(snapshot.server.drain_timeout)
        if snapshot.source is not None:
            source, sighup = snapshot.source, _on_sighup()
            supervisor.start("config_reload", lambda: reload.watch(
                source, snapshot.server.reload_interval, runtime, sighup))
        supervisor.start("model_discovery", lambda: discovery.watch(runtime))
        supervisor.start("accounts", accounts.run)
        supervisor.start("request_log", journal.run)
        supervisor.start("batches", batches.run)
        supervisor.start("mcp_servers", hub.follow)  # their links made and kept in step
        supervisor.start("mcp_audit", hub.run_audit)
        if ledger is not None:
            supervisor.start("budget_settlements", ledger.run)
        if ledger is not None or machine is not None:
            supervisor.start("parallel_leases", accounts.lease)
        if redis is not None:
            shared = RedisSync(state, redis, runtime.health, runtime.limiter,
                               runtime.longest_cooldown, runtime.latencies)
            supervisor.start("shared_state", shared.run)
        # Startup objects never become garbage: park them outside the collector.
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        get_logger().info("gateway_started", config=str(snapshot.source),
                          providers=[p.name for p in snapshot.enabled],
                          models=len(snapshot.routes))
        try:
            yield
        finally:
            await supervisor.stop()
            try:  # the Redis client is closed after it, whatever it did
                await hub.close()  # spawned MCP servers stopped
                await runtime.close()
                if ledger is not None:
                    await ledger.flush()
                await journal.close()
                await accounts.close()
                if machine is not None:
                    machine.close()
            except Exception:
                get_logger().exception("shutdown_cleanup_failed")
            if tracing is not None:  # the spans still queued are exported
                await tracing.close()


def _alone(snapshot: Snapshot, redis: Redis | None) -> bool:
    """Whether no other process reads this accounts database: one worker, a SQLite file, no
    Redis (replicas share one). Else a request without a key asks the database first."""
    workers = os.environ.get(WORKERS_ENV, "1")
    url = snapshot.database.url or IN_MEMORY
    return workers == "1" and url.startswith("sqlite") and redis is None


def _machine_ledger(snapshot: Snapshot) -> FileLedger | None:
    """With several workers and no Redis, the budgets' counts they share: a file in the state
    directory, one per accounts database; None for one worker (its memory is enough)."""
    workers = os.environ.get(WORKERS_ENV, "1")
    if not workers.isdigit() or int(workers) <= 1 or snapshot.database.url is None \
            or snapshot.source is None:
        return None
    name = hashlib.sha256(snapshot.database.url.encode()).hexdigest()[:16]
    return FileLedger(state_dir(os.environ, snapshot.source) / f"budgets-{name}.sqlite3")


def _tracing(snapshot: Snapshot) -> Tracing | None:
    """The process's tracing when llms.json or the environment asks for it (only then is
    OpenTelemetry imported: a gateway that does not trace carries none of it)."""
    if not snapshot.telemetry.wanted(os.environ):
        return None
    from gateway.observe.tracing import configure

    return configure(snapshot.telemetry, os.environ)


def _cache(policy: CachePolicy, redis: Redis | None, prefix: str, tracing: Tracing | None
           ) -> ResponseCache:
    """The response cache, sized once at start; with tracing, each lookup in a span."""
    if tracing is None:
        return ResponseCache(policy.max_bytes, policy.max_entry_bytes, redis, prefix)
    from gateway.cache.traced import TracedCache

    return TracedCache(tracing.tracer, policy.max_bytes, policy.max_entry_bytes, redis, prefix)


@contextlib.asynccontextmanager
async def _upstream(tracing: Tracing | None) -> AsyncIterator[Transport]:
    """The process's one upstream transport; with tracing, each traced call in a span."""
    async with AiohttpTransport() as transport:
        yield transport if tracing is None else tracing.transport(transport)


def handlers(snapshot: Snapshot) -> list[HTTPRouteHandler]:
    """The routes Litestar serves (the relay's and passthrough are `Front`'s): each that acts
    for a key checks it through `auth.identify` (tests/test_identity.py walks them all)."""
    return [*reads.ROUTES,
            admin.list_providers, admin.toggle_provider, admin.config_in_force,
            *admin_accounts.ROUTES, *admin_reports.ROUTES, *admin_logs.ROUTES, *console.ROUTES,
            stored_responses.retrieve_response, stored_responses.delete_response,
            stored_responses.list_input_items, *batch_routes.routes(snapshot.batches)]


def create_app(snapshot: Snapshot | None = None) -> ASGIApp:
    """Build the app for `snapshot`, or for the config discovery finds: the relay routes served
    as plain ASGI (`front`), the rest by Litestar; with `server.cors_origins`, CORS around it
    all (errors, streams and the guard's own answers included); requests from other web
    pages, and under rebound host names, refused before any of it (`origins`)."""
    request_log = logs.configure()
    if snapshot is None:
        snapshot = config.load(config.discover())
    served = Litestar(
        # The Realtime API's WebSocket: its key is checked by its session (`gateway.realtime`).
        route_handlers=[*handlers(snapshot), realtime.realtime],
        lifespan=[lifespan],
        exception_handlers={
            GatewayError: on_gateway_error,
            HTTPException: on_http_error,
            Exception: on_unexpected_error,
        },
        request_max_body_size=snapshot.server.max_body_bytes,
        state=State({"initial": snapshot, "request_log": request_log,
                     "issuers": console.Issuers()}),
        debug=False,
        openapi_config=None,
        logging_config=None,
    )
    # The relay's paths first: a model's request passes no other route's check.
    checked = Front(served, McpRoute(served, served),
                    origins=Origins.of(snapshot.server,
                                       os.environ.get(BIND_ENV) or snapshot.server.host),
                    limits=Limits.of(snapshot.server))
    if not snapshot.server.cors_origins:
        return checked
    from starlette.middleware.cors import CORSMiddleware  # only a gateway that uses it pays

    # Starlette and Litestar spell the same ASGI callable with types of their own.
    cors = CORSMiddleware(cast(Any, checked), allow_origins=list(snapshot.server.cors_origins),
                          allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                          allow_headers=["*"], expose_headers=list(EXPOSED_HEADERS),
                          max_age=600)
    return cast(ASGIApp, cors)
