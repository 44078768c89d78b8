"""What one gateway process holds, split by lifetime.

`Live` is immutable: a config snapshot, the providers built from it and their adapters, prices,
the redactor. `Runtime` is built whole at startup and lives as long as the process: the
registries (health, limits, latencies, hedging, metrics, traffic), the stores, the supervisor, the
listeners. `Runtime.apply()` builds a complete new `Live` and swaps it in with one assignment,
so a request sees either the old config or the new one, never half of each.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.responses.store import ResponseStore
from gateway.adapters.stack import Adapted, adapted
from gateway.cache.semantic_store import SemanticStore
from gateway.cache.store import ResponseCache
from gateway.config.providers import unknown
from gateway.config.snapshots import prices as priced
from gateway.config.snapshots import secrets as config_secrets
from gateway.config.snapshots import with_discovered, with_provider_disabled
from gateway.core.call import Next
from gateway.core.facts import Unpriced
from gateway.core.limits import RateLimiter
from gateway.core.record import Listener
from gateway.core.settings import ADMIN_DISABLED, CachePolicy, ConfigError, Route, Snapshot
from gateway.core.tools import ToolHub
from gateway.guardrails.entities import Models
from gateway.guardrails.tally import Tally
from gateway.idempotency.flight import Idempotency
from gateway.idempotency.store import IdempotencyStore
from gateway.observe.logs import RequestLog
from gateway.observe.metrics import Metrics
from gateway.observe.observers import measured_by, observed_by, spent_by
from gateway.observe.traffic import ProviderTraffic, RecentTraffic
from gateway.queue.queueing import Queue, Ticket
from gateway.routing.health import ProviderHealth
from gateway.routing.hedging import Hedging
from gateway.routing.sorting import Throughputs
from gateway.routing.strategy import Latencies, Spread
from gateway.state.drain import Drain
from gateway.state.supervise import Supervisor
from providers.contract.lasting import Lasting
from providers.contract.log import get_logger
from providers.contract.provider import Provider, ProviderDisabled
from providers.contract.redact import Redactor
from providers.contract.spec import CircuitPolicy, Retries
from providers.contract.transport import Transport
from providers.contract.usage import Price

if TYPE_CHECKING:  # Redis, accounts and tracing are imported by a gateway that uses them, only
    from redis.asyncio import Redis

    from gateway.accounts.service import Accounts
    from gateway.observe.tracing import Tracing

# The stages `Runtime.trace` hears, in the order a whole answer passes them.
STAGES = ("request", "admitted", "provider", "reply", "answered", "logged")


Composer = Callable[["Runtime", "Live"], Mapping[str, Next]]
Serving = Callable[[Mapping[str, str], str], AbstractContextManager[Any]]
_NOTHING = contextlib.nullcontext()  # stateless: one for every request


def _unobserved(headers: Mapping[str, str], endpoint: str) -> AbstractContextManager[Any]:
    return _NOTHING


@dataclass(frozen=True, slots=True)
class Live:
    """One config snapshot, its live providers and their adapters; replaced whole on reload."""

    snapshot: Snapshot
    providers: Mapping[str, Provider]
    # Per endpoint, the providers as its requests reach them (bridges, batches, assembly).
    adapted: Adapted
    models_body: bytes
    prices: Mapping[tuple[str, str], Price]
    # Removes this config's secrets from everything that leaves the process.
    redactor: Redactor
    # Per relay endpoint, its stages composed for this snapshot (`gateway.pipeline.stack`).
    stacks: Mapping[str, Next] = field(default_factory=dict)
    # The routes whose model has no price of its own (priced at `defaults.unpriced`, if any).
    unpriced: tuple[Unpriced, ...] = ()


def check_kinds(snapshot: Snapshot, kinds: Mapping[str, type[Provider]]) -> None:
    """Every enabled provider names a known kind, and every provider of a known kind holds only
    fields it or its kind reads; else a ConfigError naming each wrong field."""
    for spec in snapshot.enabled:
        if spec.kind not in kinds:
            known = ", ".join(sorted(kinds))
            raise ConfigError(f"{snapshot.source}: providers.{spec.name}.type: unknown provider "
                              f"type '{spec.kind}' (known: {known})")
    wrong = [problem for spec in snapshot.providers if (kind := kinds.get(spec.kind)) is not None
             for problem in unknown(spec, kind.fields, kind.model_fields)]
    if wrong:
        raise ConfigError(f"{snapshot.source}: " + "; ".join(wrong))


def build(snapshot: Snapshot, transport: Transport, kinds: Mapping[str, type[Provider]],
          store: ResponseStore, health: ProviderHealth | None = None,
          tracing: Tracing | None = None) -> Live:
    """Instantiate every enabled provider and its adapters (`health`: the breakers a resume's
    candidates are ordered by; with `tracing`, each try in a span); an unknown type or bad
    field is a ConfigError."""
    check_kinds(snapshot, kinds)
    providers: dict[str, Provider] = {}
    for spec in snapshot.enabled:
        try:
            providers[spec.name] = kinds[spec.kind](spec, transport)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{snapshot.source}: providers.{spec.name}: {exc}") from exc
    prices, unpriced = priced(snapshot)
    redactor = Redactor.of(config_secrets(snapshot))
    return Live(snapshot, providers,
                adapted(providers, store, snapshot, health,
                        tries_traced(tracing, snapshot, redactor), prices),
                models_list(snapshot), prices, redactor, unpriced=unpriced)


def tries_traced(tracing: Tracing | None, snapshot: Snapshot, redactor: Redactor
                 ) -> Callable[[Provider], Provider] | None:
    """What wraps each adapted provider so its tries are spans; None when tracing is off."""
    if tracing is None:
        return None
    from gateway.adapters.traced import Traced

    private = frozenset(key.limits.key_id for key in snapshot.keys + snapshot.admin_keys
                        if key.private)
    return lambda provider: Traced(provider, tracing, redactor, private)


def models_list(snapshot: Snapshot, created: int | None = None) -> bytes:
    """`GET /v1/models`: every alias an enabled provider serves, owned by the first of them,
    and every name `alias_of` makes one of them."""
    stamp = int(time.time()) if created is None else created
    data = [model_card(alias, routes[0].provider, stamp)
            for alias, routes in snapshot.routes.items()]
    # A name given `alias_of` is a model clients may ask for too; a pattern is not listed.
    data += [model_card(name, routes[0].provider, stamp)
             for name, alias in snapshot.names.exact.items()
             if name not in snapshot.routes and (routes := snapshot.routes.get(alias))]
    return msgspec.json.encode({"object": "list", "data": data})


def model_card(alias: str, owner: str, created: int) -> dict[str, object]:
    """One entry of the models list, in OpenAI's `Model` shape."""
    return {"id": alias, "object": "model", "created": created, "owned_by": owner}


class Runtime:
    """The process's state for its whole life, and the current `Live` (swapped on reload)."""

    def __init__(self, transport: Transport, kinds: Mapping[str, type[Provider]],
                 request_log: RequestLog | None = None, *, cache: ResponseCache,
                 responses: ResponseStore, redis: Redis | None = None,
                 tracing: Tracing | None = None,
                 idempotency: IdempotencyStore | None = None,
                 accounts: Accounts | None = None, stacks: Composer | None = None,
                 semantic: SemanticStore | None = None,
                 journal: Listener | None = None) -> None:
        self.transport = transport  # the process's one upstream client, shared by every provider
        self.request_log = request_log or RequestLog(None, sys.stderr.buffer)
        self.kinds = kinds
        self.started = time.time()
        self.health = ProviderHealth()
        self.spread = Spread()  # the weighted strategy's turns, per alias
        self.latencies = Latencies()  # what the latency strategy has learned
        self.throughputs = Throughputs()  # streams' tokens per second (the throughput sort)
        self.hedging = Hedging()  # per alias: hedge delays learned, budgets spent
        self.limiter = RateLimiter()
        self.metrics = Metrics(self.health, inflight=lambda: self.inflight,
                               queued=lambda: self.queue.depth, hedging=self.hedging)
        # The slots under server.max_concurrency and the requests waiting for one.
        self.queue = Queue(on_wait=self.metrics.queue_wait, on_drop=self.metrics.queue_dropped,
                           on_depth=self.metrics.add_queued)
        self.traffic = RecentTraffic()
        self.guardrails = Tally()  # what guardrails did here, for the status page
        # Named-entity models (guardrails' names and places): loaded once, kept across reloads.
        self.entity_models = Models()
        self.provider_traffic = ProviderTraffic()
        self.inflight = 0  # relay requests in the gateway: served, or waiting in the queue
        self.disabled_by_admin: set[str] = set()
        self.discovered: dict[str, tuple[str, ...]] = {}  # "models": "*" listings, by provider
        # The reason each disabled provider was last logged with: a reload that changes nothing
        # about it logs nothing, so the log is not one line per provider per reload.
        self.disabled_logged: dict[str, str] = {}
        self.responses = responses
        self.cache = cache
        sized = CachePolicy()  # the semantic cache's own, else sized as the defaults say
        self.semantic = semantic or SemanticStore(sized.max_bytes, sized.max_entry_bytes,
                                                  sized.max_entries)
        # `Idempotency-Key` requests: those running here, and the store of those completed.
        self.idempotency = Idempotency(idempotency or IdempotencyStore(), self.hold)
        self.redis = redis  # the process's one Redis client; None with the memory backend
        self.configured: Snapshot | None = None  # the file's config, before admin overrides
        # The last reload that was refused or invalid ({"error", "at"}), until one succeeds.
        self.config_error: dict[str, Any] | None = None
        self.lasting = Lasting()  # what outlives snapshots: worker pools
        self.supervisor = Supervisor()  # the background tasks, restarted when they fail
        self.drain = Drain()  # open streams, ended in-band if still open late in a shutdown
        # Called with the name of each stage a relayed request passes (`STAGES`), for a
        # profiler such as bench/stages.py; None in production, where it costs one check each
        # (made where the stage is passed: a method doing it was a call each).
        self.trace: Callable[[str], None] | None = None
        # Traces (`gateway.observe.tracing`): None when off, and then nothing of it runs.
        self.tracing = tracing
        # What a relayed request is served within, by the edge: its server span (current while
        # its answer is written, a stream included), or nothing when tracing is off.
        self.serving: Serving = tracing.serving if tracing is not None else _unobserved
        # Virtual keys, teams, budgets and spend (`gateway.accounts`); None: static keys only.
        self.accounts = accounts
        charged: tuple[Listener, ...] = (accounts.ended,) if accounts is not None else ()
        # The request log's rows (`gateway.requestlog.journal.Journal.ended`), given by the app.
        journaled: tuple[Listener, ...] = (journal,) if journal is not None else ()
        traced: tuple[Listener, ...] = ()
        if tracing is not None:
            from gateway.observe.tracing import server_spans

            traced = (server_spans(),)
        # Told of every request's record when it ends, in this order.
        self.listeners: tuple[Listener, ...] = (
            observed_by(self.metrics, self.traffic, self.provider_traffic, self.request_log),
            spent_by(self.limiter),
            measured_by(self.throughputs, self.route_of), *charged, *journaled, *traced,
            self._staged)
        # What composes each snapshot's stages (`gateway.pipeline.stack.stacks`, given by the
        # app: the runtime holds state, the pipeline above it decides what a request passes).
        self.stacks = stacks
        # The MCP servers' tools, for a model's tool loop (`gateway.mcp.hub.Hub`, set by the app).
        self.tools: ToolHub | None = None
        self._live: Live | None = None

    @property
    def live(self) -> Live:
        if self._live is None:
            raise RuntimeError("gateway has no config yet")
        return self._live

    def longest_cooldown(self, provider: str) -> float:
        """The longest one 429 may keep `provider` out of service: as long as its Retry-After
        is believed, or its plain cooldown if that is longer (the defaults' if not live)."""
        found = self.live.providers.get(provider)
        retries, circuit = (found.spec.retries, found.spec.circuit) if found is not None \
            else (Retries(), CircuitPolicy())
        return max(retries.max_retry_after, circuit.rate_limit_cooldown)

    def price_of(self, provider: str, alias: str) -> Price | None:
        """What `provider` charges for `alias`, as the live config prices it."""
        return self.live.prices.get((provider, alias))

    def route_of(self, alias: str, provider: str) -> Route | None:
        """The route by which `provider` serves `alias`, if it still does."""
        return next((r for r in self.live.snapshot.routes.get(alias, ())
                     if r.provider == provider), None)

    def _staged(self, _: object) -> None:
        if self.trace is not None:
            self.trace("logged")

    def enter(self) -> None:
        """A relay request arrives (`front.Front`, the one caller); its ticket for a slot
        under the concurrency cap (`queue.ticket()`) is waited on at admission."""
        self.inflight += 1
        if self.metrics.shared is not None:  # else read when scraped: no call to make
            self.metrics.add_inflight(1)

    def hold(self) -> Callable[[], None]:
        """A slot taken at once, past the cap if need be, for work already running whose
        request left (a keyed flight); the function that gives it back."""
        self.enter()
        ticket = self.queue.hold()
        return lambda: self.leave(ticket)

    def leave(self, ticket: Ticket) -> None:
        """Its answer is sent, or abandoned: its slot, or its place in the queue, is free."""
        self.inflight -= 1
        if self.metrics.shared is not None:
            self.metrics.add_inflight(-1)
        self.queue.leave(ticket)

    async def apply(self, snapshot: Snapshot) -> None:
        """Make `snapshot` live; on any error the previous config keeps serving."""
        effective = with_discovered(snapshot, self.discovered)
        for name in self.disabled_by_admin:
            effective = with_provider_disabled(effective, name, ADMIN_DISABLED)
        live = build(effective, self.transport, self.kinds, self.responses, self.health,
                     self.tracing)
        self.configured = snapshot
        disabled = await _start_all(live, self.lasting)
        if disabled:
            for name, reason in disabled.items():
                effective = with_provider_disabled(effective, name, reason)
            serving = {n: p for n, p in live.providers.items() if n not in disabled}
            prices, unpriced = priced(effective)
            live = Live(effective, serving, adapted(
                serving, self.responses, effective, self.health,
                tries_traced(self.tracing, effective, live.redactor), prices),
                models_list(effective), prices, live.redactor, unpriced=unpriced)
        if self.stacks is not None:
            live = replace(live, stacks=self.stacks(self, live))
        previous, self._live = self._live, live
        server = effective.server
        self.queue.configure(server.max_concurrency, server.max_queue, server.max_body_bytes_held)
        self.request_log.redaction.redactor = live.redactor
        routed = [route for routes in effective.routes.values() for route in routes]
        self.health.retain(routed)
        self.latencies.retain(routed)
        self.throughputs.retain(routed)
        self.hedging.retain((alias, route.provider) for alias, routes in effective.routes.items()
                            for route in routes)
        self.spread.retain(effective.routes)
        self.provider_traffic.retain({p.name for p in effective.providers})
        self._log_disabled(effective)
        if previous is not None:
            await _close_all(previous)

    def _log_disabled(self, snapshot: Snapshot) -> None:
        """One `provider_disabled` line per provider and reason: again only when the reason
        changes, or after the provider was enabled in between."""
        log = get_logger()
        now = {spec.name: spec.disabled_reason or "disabled" for spec in snapshot.providers
               if not spec.enabled}
        for name, reason in now.items():
            if self.disabled_logged.get(name) != reason:
                log.info("provider_disabled", provider=name, reason=reason)
        self.disabled_logged = now

    async def set_enabled(self, name: str, enabled: bool) -> None:
        """Enable or disable a provider at runtime; it lasts across config reloads."""
        if enabled:
            self.disabled_by_admin.discard(name)
        else:
            self.disabled_by_admin.add(name)
        if self.configured is not None:
            await self.apply(self.configured)

    async def close(self) -> None:
        """Stop what still runs for requests, then close the providers and their pools."""
        await self.idempotency.close()
        if self._live is not None:
            await _close_all(self._live)
        await self.lasting.close()


async def _start_all(live: Live, lasting: Lasting) -> dict[str, str]:
    """Start every provider; those that cannot serve here are closed and returned with why."""
    disabled = {}
    for name, provider in live.providers.items():
        try:
            await provider.start(lasting)
        except ProviderDisabled as exc:
            disabled[name] = str(exc)
            await provider.close()
    return disabled


async def _close_all(live: Live) -> None:
    for provider in live.providers.values():
        await provider.close()
