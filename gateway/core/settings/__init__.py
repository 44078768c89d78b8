"""The settings types: what a resolved llms.json holds, as immutable values.

`gateway.config` reads the file into these, and the rest of the gateway reads these, never the
file. Defaults are constants here, in one place. A capability that owns a folder of its own
keeps its settings in a module of its own here (`guardrails`, `realtime`, `console`, `logs`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from gateway.core.aliases import Chains, Names
from gateway.core.limits import PRIORITY_BOUND, KeyLimits
from gateway.core.settings.console import UiConfig
from gateway.core.settings.guardrails import GuardrailPolicy
from gateway.core.settings.logs import LogsConfig
from gateway.core.settings.mcp import McpServer, McpSettings
from gateway.core.settings.realtime import RealtimeConfig
from providers.contract.spec import ProviderSpec, Secret
from providers.contract.usage import Price

# What `/v1/responses` keeps for `previous_response_id`, and what `Idempotency-Key` requests
# remember, unless llms.json says otherwise.
DEFAULT_STORE_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_STORE_MAX_ENTRY_BYTES = 16 * 1024 * 1024
DEFAULT_IDEMPOTENCY_TTL = 24 * 3600.0
DEFAULT_IDEMPOTENCY_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_IDEMPOTENCY_MAX_ENTRY_BYTES = 4 * 1024 * 1024
DEFAULT_IDEMPOTENCY_LEASE = 10.0

_QUANTILE = re.compile(r"p(\d{2}(?:\.\d+)?)")


def quantile(text: str) -> float:
    """`"p90"` as 0.9; ValueError (its message fit for a config error) unless `text` is a
    quantile from p50 to p99.9 (`routing.hedge_after`)."""
    found = _QUANTILE.fullmatch(text)
    if found is None or not 50 <= float(found[1]) <= 99.9:
        raise ValueError(f"must be seconds (a number above 0) or a quantile from \"p50\" to "
                         f"\"p99.9\", got {text!r}")
    return float(found[1]) / 100


MiB = 1024 * 1024


class BatchesConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bounds of `/v1/files` uploads and of the batch runner (`gateway.batches.runner`)."""

    # An uploaded file is kept in the database: its size, its lines and each line are bounded.
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1024 * MiB)] = 64 * MiB
    max_lines: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 50_000
    max_line_bytes: Annotated[int, msgspec.Meta(ge=256, le=64 * MiB)] = 4 * MiB
    # A batch's requests in flight at once, per process, over every batch.
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 4
    # Seconds between two looks at the database for work (a new batch, a cancel elsewhere).
    poll_interval: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0
    # Seconds a process holds a request it runs, renewed while it runs: a request held by a
    # process that died is run again once its hold lapses (its result is kept once).
    lease: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0


DEFAULT_MAX_BODY_BYTES = 20 * 1024 * 1024
# The request bodies one process holds at once (read, or being read): 128 MiB, six bodies at the
# largest size; with the copies a request makes of its body, a few hundred MiB at most.
DEFAULT_MAX_BODY_BYTES_HELD = 128 * 1024 * 1024


# Why a provider is disabled, as `ls`, `/ready` and the status page say it.
IN_CONFIG = "disabled in config"  # "enabled": false


ADMIN_DISABLED = "disabled by an admin"  # POST /admin/providers/{name}/disable


class KeyEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A gateway key with an id for logs, optional per-minute limits, and how its requests
    wait in the queue at the concurrency cap (`gateway.queue.queueing`)."""

    key: str
    id: str | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    private: bool = False  # its prompts and completions are never recorded on traces
    # Its requests' priority when they send no `x-llms-priority`, and the most they may ask
    # for (None: `priority`, so a key cannot raise itself above what it was given).
    priority: Annotated[int, msgspec.Meta(ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)] = 0
    max_priority: Annotated[int, msgspec.Meta(ge=-PRIORITY_BOUND, le=PRIORITY_BOUND)] | None = None
    # Seconds its requests may wait in the queue without `x-llms-timeout` (None: the server's).
    timeout: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # Requests it starts per turn among the keys waiting (fair share between keys).
    weight: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the gateway listens and who may use it."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str | KeyEntry, ...] = ()
    # Keys for the admin routes (and accepted wherever a client key is); none: admin routes
    # answer only this machine.
    admin_keys: tuple[str | KeyEntry, ...] = ()
    # Read routes (/v1/models, /metrics, /status.json) that need no key even when keys are set.
    public_paths: tuple[str, ...] = ()
    # Browser origins allowed to call the gateway (`"*"` for any); none: no CORS headers.
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Bytes of request bodies held at once by the requests of one process, queued or in flight
    # (`gateway.queue.bodies`): past them a request is refused (503) before its body is read.
    max_body_bytes_held: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_MAX_BODY_BYTES_HELD
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024
    max_concurrency: int = 10_000
    # Requests that wait for a slot at `max_concurrency` (0: refuse at once): bounded, since
    # each holds its connection and body.
    max_queue: Annotated[int, msgspec.Meta(ge=0)] = 1_000
    # The longest a request waits in that queue; `x-llms-timeout` and a key's `timeout` can
    # only shorten it.
    queue_timeout: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    allow_unauthenticated: bool = False
    reload_interval: float = 1.0
    # Seconds a connection may take to deliver a whole request head (a slow client holds a file
    # descriptor all that time), and a declared body after it.
    header_timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    body_timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    # Longer than clients keep idle connections (httpx and the OpenAI SDK: 5 s, aiohttp: 15 s):
    # were it equal, a client could reuse a connection just as the server closes it (a reset).
    # The server waits for the next request head at most this and `header_timeout` (granian has
    # one timer for both), so an idle connection closes after the shorter of the two.
    keepalive_timeout: Annotated[float, msgspec.Meta(gt=0)] = 75.0
    # Seconds open streams get to finish after SIGTERM; then each ends with an in-band error
    # (`gateway.state.drain`), before the server's own patience (a few seconds more) ends.
    drain_timeout: Annotated[float, msgspec.Meta(gt=0)] = 25.0


class MaxPrice(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The dearest price a candidate may charge, in US dollars per million tokens (`max_price`,
    OpenRouter's spelling); None: no bound on that side."""

    prompt: Annotated[float, msgspec.Meta(ge=0)] | None = None
    completion: Annotated[float, msgspec.Meta(ge=0)] | None = None


class RoutingPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How an alias's candidates are tried (`routing`, in defaults or per alias)."""

    # order: file order; weighted: the first try spread by providers' `weight`, then file
    # order; latency: the lowest recent time to first token first, exploring a share of tries;
    # price: the cheapest for this request first (unknown prices last); throughput: the most
    # tokens per second first (`gateway.routing.sorting`).
    strategy: Literal["order", "weighted", "latency", "price", "throughput"] = "order"
    # Candidates dearer than this (or with no known price) are not tried (`gateway.routing.
    # sorting.within`); a request's `provider.max_price` applies beside it.
    max_price: MaxPrice | None = None
    explore: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    # Seconds without a first token before the next candidate is started too (None: never),
    # or a quantile of the leading candidate's recent times to first token ("p90", learned:
    # `gateway.routing.hedging`).
    hedge_after: Annotated[float, msgspec.Meta(gt=0)] | str | None = None
    # The largest share of the alias's recent requests that may be hedged: when everything is
    # slow at once, hedging must not double the load on providers already struggling.
    hedge_budget: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    # The budget's floor: hedges per minute the alias may start whatever its share says, so a
    # quiet alias hedges its slow requests too (`gateway.routing.hedging`); 0: none.
    hedge_min: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 3


class SemanticCache(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A chat answer served again to a question worded differently (`cache.semantic`,
    `gateway.cache.semantic`): the last user turn embedded through `embedding_alias`, the rest
    of the request matched exactly."""

    embedding_alias: str
    # The least cosine similarity served: high, since a near question may want another answer.
    threshold: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.95
    ttl: Annotated[float, msgspec.Meta(gt=0)] = 3600.0  # seconds an answer is kept
    # Requests asking for more randomness than this are not kept nor served; a request that
    # names no temperature is. OpenAI's default is 1: above it, a client asks for variety.
    max_temperature: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    max_n: Annotated[int, msgspec.Meta(ge=1, le=128)] = 1  # choices a cached request may ask
    tool_calls: bool = False  # keep answers that call tools (they act on the world)
    # A longer last user turn is not cached: a long text with a small change embeds close.
    max_chars: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 2000
    # Seconds the embedding may take; past them (or on any failure) the lookup is a miss.
    timeout: Annotated[float, msgspec.Meta(gt=0, le=30)] = 1.0


class CachePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Whether complete answers are kept and replayed (`cache`, in defaults or per alias)."""

    ttl: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # seconds; 0: off
    # The cache's size in each process (read from defaults only).
    max_bytes: Annotated[int, msgspec.Meta(gt=0)] = 64 * 1024 * 1024
    max_entry_bytes: Annotated[int, msgspec.Meta(gt=0)] = 1024 * 1024
    # Whose answers a request may be served: its key's, its team's (a key without a team:
    # its own), or anyone's (`global`).
    scope: Literal["key", "team", "global"] = "key"
    semantic: SemanticCache | None = None
    # The semantic cache's entries in each process (read from defaults only).
    max_entries: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 10_000


class AliasPolicy(msgspec.Struct, frozen=True):
    """What one alias does beyond its candidates: routing, caching, resuming broken streams."""

    routing: RoutingPolicy = RoutingPolicy()
    cache: CachePolicy = CachePolicy()
    # A chat stream broken after its first token is continued by a candidate, at most
    # `max_resumes` times (`gateway.adapters.resume`); opt-in: another model may change style.
    resume: bool = False
    max_resumes: int = 1
    guardrails: tuple[str, ...] = ()  # the policies of `Snapshot.guardrails` its requests pass
    # What the request log keeps of its requests (`models.<alias>.logs.capture`); None: `logs`'.
    capture: Literal["metadata", "bodies"] | None = None


class StateConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where breaker and cooldown state lives: this process, or Redis shared by all."""

    backend: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "llms-gateway:"
    sync_interval: float = 0.5


class ResponsesConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What `/v1/responses` keeps for `previous_response_id` (in each process; restart to
    change)."""

    store_max_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_STORE_MAX_BYTES
    store_max_entry_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_STORE_MAX_ENTRY_BYTES


class IdempotencyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How long and how much `Idempotency-Key` requests are remembered (`idempotency`; the
    byte bounds are read at start, `ttl` and `max_waiters` on every request)."""

    ttl: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_IDEMPOTENCY_TTL
    max_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_IDEMPOTENCY_MAX_BYTES
    # A larger answer is not remembered: its retry runs again.
    max_entry_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_IDEMPOTENCY_MAX_ENTRY_BYTES
    # Retries that may wait on one running request; past it, a 409.
    max_waiters: Annotated[int, msgspec.Meta(ge=1)] = 16
    # With Redis, seconds a replica's claim on a running keyed request lasts unless renewed
    # (a third of this apart, while it runs): how soon retries waiting on other replicas run
    # it themselves once that replica was killed (read at start).
    lease: Annotated[float, msgspec.Meta(ge=1, le=3600)] = DEFAULT_IDEMPOTENCY_LEASE


class Telemetry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """OpenTelemetry traces (`gateway.observe.tracing`): off unless `otlp_endpoint` is set here
    or `OTEL_EXPORTER_OTLP_ENDPOINT` in the environment (read at start; restart to change)."""

    # The collector's OTLP/HTTP base URL (`/v1/traces` is added), as OTEL_EXPORTER_OTLP_ENDPOINT.
    otlp_endpoint: str | None = None
    service_name: str | None = None  # else OTEL_SERVICE_NAME, else "llms-gateway"
    # The share of new traces kept (a client's sampled trace is always continued); None:
    # OTEL_TRACES_SAMPLER decides, else every trace is kept.
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    # Record prompts and completions on attempt spans, each cut to `max_content_bytes`; never
    # for a key marked `private`.
    capture_content: bool = False
    max_content_bytes: Annotated[int, msgspec.Meta(gt=0)] = 8 * 1024

    def wanted(self, environ: Mapping[str, str]) -> bool:
        """Whether traces are on: an endpoint here or in the environment, and the SDK not
        turned off there (`OTEL_SDK_DISABLED`, `OTEL_TRACES_EXPORTER=none`)."""
        if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" \
                or environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
            return False
        return bool(self.otlp_endpoint or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class DatabaseConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The accounts database (`gateway.accounts`): keys, teams, spend, audit (read at start)."""

    # sqlite:///PATH or postgresql://USER@HOST:PORT/DB ("$NAME" expanded); None: SQLite in the
    # state directory (`state_dir`).
    url: str | None = None
    # Seconds between two looks at the directory's revision: how soon a revocation or a budget
    # change reaches every worker and replica.
    poll_interval: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.5
    flush_interval: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0  # spend rows written
    # Spend rows held while the database is down; past it the oldest are dropped (counted).
    max_buffered_rows: Annotated[int, msgspec.Meta(ge=1000, le=10_000_000)] = 200_000
    retention_days: Annotated[int, msgspec.Meta(ge=1, le=36_500)] = 400
    # Seconds a request's `max_parallel` slot is held in the ledger workers and replicas share
    # unless its process renews it (a third of this apart, while the request runs): how soon a
    # killed process's slots are free again.
    parallel_lease: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 10.0


@dataclass(frozen=True, slots=True)
class GatewayKey:
    """A key clients may present, resolved from the environment."""

    secret: Secret
    limits: KeyLimits
    private: bool = False  # never has its content recorded (`telemetry.capture_content`)


@dataclass(frozen=True, slots=True)
class Route:
    """One candidate for an alias: which provider, and the id it wants."""

    provider: str
    upstream_model: str
    weight: float = 1.0  # the provider's share of first tries with the `weighted` strategy
    # Tokens the model holds, prompt and answer together, and the longest answer it writes
    # (`gateway.core.facts`); None: unknown, so never skipped for size.
    context_window: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole resolved config; swapped as one object on reload."""

    source: Path | None
    server: ServerConfig
    providers: tuple[ProviderSpec, ...]
    routes: Mapping[str, tuple[Route, ...]]
    state: StateConfig = field(default_factory=StateConfig)
    keys: tuple[GatewayKey, ...] = ()
    admin_keys: tuple[GatewayKey, ...] = ()
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    idempotency: IdempotencyConfig = field(default_factory=IdempotencyConfig)
    default_policy: AliasPolicy = field(default_factory=AliasPolicy)
    policies: Mapping[str, AliasPolicy] = field(default_factory=dict)
    names: Names = field(default_factory=Names)
    chains: Chains = field(default_factory=Chains)

    def resolve(self, model: str) -> str:
        """The alias that serves the name a client sent (`alias_of`, patterns)."""
        return self.names.resolve(model, self.routes)
    telemetry: Telemetry = field(default_factory=Telemetry)
    # `url` resolved: the file's (expanded), else SQLite in the state directory; None only for a
    # snapshot built without a file (an in-memory database then).
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    batches: BatchesConfig = field(default_factory=BatchesConfig)  # `/v1/files`, `/v1/batches`
    realtime: RealtimeConfig = field(default_factory=RealtimeConfig)  # `/v1/realtime`
    # What a budgeted key pays for a model no price is known for (`defaults.unpriced`): None
    # refuses it (403 `model_unpriced`), a price is held and charged instead.
    unpriced: Price | None = None
    # `guardrails`: policies by name, attached to aliases (`AliasPolicy.guardrails`), keys
    # and teams (`gateway.accounts`).
    guardrails: Mapping[str, GuardrailPolicy] = field(default_factory=dict)
    ui: UiConfig = field(default_factory=UiConfig)  # the web console (`gateway.console`)
    # The file as written ("$NAME" unexpanded): what `/admin/config` shows, secrets hidden.
    document: Mapping[str, object] = field(default_factory=dict, repr=False)
    logs: LogsConfig | None = None  # the request log (`gateway.requestlog`); None: off
    # Upstream MCP servers (`mcp_servers`) and how they are served (`mcp`): `gateway.mcp`.
    mcp_servers: tuple[McpServer, ...] = ()
    mcp: McpSettings = field(default_factory=McpSettings)

    def policy(self, alias: str) -> AliasPolicy:
        """The routing and cache policy of `alias`: its own in `models`, else the defaults."""
        return self.policies.get(alias, self.default_policy)

    @property
    def any_keys(self) -> bool:
        """Whether any key, client or admin, is configured: then reading needs one."""
        return bool(self.keys or self.admin_keys)

    @property
    def enabled(self) -> tuple[ProviderSpec, ...]:
        return tuple(p for p in self.providers if p.enabled)


class ConfigError(Exception):
    """The config file is missing or invalid; the message names the file and the field."""
