"""llms.json: find it, read it, check it, and resolve it into an immutable `Snapshot`.

The file is read into plain structs (what the user wrote), then resolved: `"$NAME"` strings read
the environment, per-provider `timeouts`/`retries` are merged over `defaults`, providers whose key
is unset are disabled with a reason, and the alias → candidates table is computed once, so the
hot path is a dict lookup. Every error names the file, the field and the problem.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import yaml

from gateway.batches.settings import BatchesConfig
from gateway.pipeline import hedging
from gateway.pipeline.limits import PRIORITY_BOUND, KeyLimits
from gateway.state import aliases
from gateway.state.aliases import AliasError, Chains, Names
from gateway.state.facts import Facts, facts
from gateway.stores.idempotency import DEFAULT_MAX_BYTES as DEFAULT_IDEMPOTENCY_MAX_BYTES
from gateway.stores.idempotency import (
    DEFAULT_MAX_ENTRY_BYTES as DEFAULT_IDEMPOTENCY_MAX_ENTRY_BYTES,
)
from gateway.stores.idempotency import DEFAULT_TTL as DEFAULT_IDEMPOTENCY_TTL
from gateway.stores.responses import DEFAULT_MAX_BYTES as DEFAULT_STORE_MAX_BYTES
from gateway.stores.responses import DEFAULT_MAX_ENTRY_BYTES as DEFAULT_STORE_MAX_ENTRY_BYTES
from providers.contract.redact import url_secrets
from providers.contract.spec import (
    DEFAULT_MAX_ANSWER_EVENTS,
    CircuitPolicy,
    Discovery,
    ModelEntry,
    ProviderEntry,
    ProviderSpec,
    Retries,
    Secret,
    Timeouts,
    TlsEntry,
)
from providers.contract.transport import (
    DEFAULT_MAX_ANSWER_BYTES,
    ProxyEnvironment,
    TlsOptions,
    check_proxy,
)

DEFAULT_MAX_BODY_BYTES = 20 * 1024 * 1024
# A config is a few KB; one this large is a mistake, and parsing it would hold a core.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
CONFIG_ENV = "LLMS_CONFIG"
# Set by `serve` for its workers: the address bound, and whether --allow-unauthenticated was given.
BIND_ENV = "LLMS_BIND_HOST"
OPEN_ENV = "LLMS_ALLOW_UNAUTHENTICATED"
STATE_DIR_ENV = "LLMS_STATE_DIR"  # where the default accounts database lives
WORKERS_ENV = "LLMS_WORKERS"  # set by `serve` for its workers: how many share this machine
CONFIG_NAMES = ("llms.json", "llms.yaml", "llms.yml")
# Why a provider is disabled, as `ls`, `/ready` and the status page say it.
IN_CONFIG = "disabled in config"  # "enabled": false
ADMIN_DISABLED = "disabled by an admin"  # POST /admin/providers/{name}/disable

S = TypeVar("S", bound=msgspec.Struct)


class ConfigError(Exception):
    """The config file is missing or invalid; the message names the file and the field."""


class KeyEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A gateway key with an id for logs, optional per-minute limits, and how its requests
    wait in the queue at the concurrency cap (`gateway.pipeline.queueing`)."""

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
    # (`gateway.edge.drain`), before the server's own patience (a few seconds more) ends.
    drain_timeout: Annotated[float, msgspec.Meta(gt=0)] = 25.0


class RoutingPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How an alias's candidates are tried (`routing`, in defaults or per alias)."""

    # order: file order; weighted: the first try spread by providers' `weight`, then file
    # order; latency: the lowest recent time to first token first, exploring a share of tries.
    strategy: Literal["order", "weighted", "latency"] = "order"
    explore: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    # Seconds without a first token before the next candidate is started too (None: never),
    # or a quantile of the leading candidate's recent times to first token ("p90", learned:
    # `gateway.pipeline.hedging`).
    hedge_after: Annotated[float, msgspec.Meta(gt=0)] | str | None = None
    # The largest share of the alias's recent requests that may be hedged: when everything is
    # slow at once, hedging must not double the load on providers already struggling.
    hedge_budget: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05


class CachePolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Whether complete answers are kept and replayed (`cache`, in defaults or per alias)."""

    ttl: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # seconds; 0: off
    # The cache's size in each process (read from defaults only).
    max_bytes: Annotated[int, msgspec.Meta(gt=0)] = 64 * 1024 * 1024
    max_entry_bytes: Annotated[int, msgspec.Meta(gt=0)] = 1024 * 1024


class AliasPolicy(msgspec.Struct, frozen=True):
    """What one alias does beyond its candidates: routing, caching, resuming broken streams."""

    routing: RoutingPolicy = RoutingPolicy()
    cache: CachePolicy = CachePolicy()
    # A chat stream broken after its first token is continued by a candidate, at most
    # `max_resumes` times (`gateway.adapters.resume`); opt-in: another model may change style.
    resume: bool = False
    max_resumes: int = 1


class _AliasEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    routing: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    # This name (or pattern, with `*`) serves as another alias (`gateway.state.aliases`).
    alias_of: str | None = None
    # Aliases tried after this one's candidates: for any failure, or per failure class.
    fallbacks: tuple[str, ...] | dict[str, tuple[str, ...]] = ()
    resume: bool = False
    max_resumes: Annotated[int, msgspec.Meta(ge=1, le=10)] = 1


class _Defaults(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    timeouts: dict[str, Any] = {}
    retries: dict[str, Any] = {}
    circuit: dict[str, Any] = {}
    routing: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    # Whole-answer requests go upstream as streams, so a hung provider is failed over after
    # `first_token` (`gateway.adapters.assemble`); a provider's own `stream_upstream` overrides it.
    stream_upstream: bool = True
    # The largest whole upstream answer, also once decompressed; a provider may set its own.
    max_answer_bytes: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_MAX_ANSWER_BYTES
    # The most events of a stream assembled into a whole answer; a provider may set its own.
    max_answer_events: Annotated[int, msgspec.Meta(gt=0)] = DEFAULT_MAX_ANSWER_EVENTS


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


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    providers: dict[str, dict[str, Any]]
    # Per alias: `routing` and `cache` over the defaults'.
    models: dict[str, _AliasEntry] = {}
    server: dict[str, Any] = {}
    defaults: _Defaults = _Defaults()
    state: StateConfig = StateConfig()
    responses: ResponsesConfig = ResponsesConfig()
    idempotency: IdempotencyConfig = IdempotencyConfig()
    telemetry: Telemetry = Telemetry()
    database: DatabaseConfig = DatabaseConfig()
    batches: BatchesConfig = BatchesConfig()


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
    # (`gateway.state.facts`); None: unknown, so never skipped for size.
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


def discover(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Find the config: `--config`, then `$LLMS_CONFIG`, then ./llms.json, then ~/.llms/."""
    if explicit:
        return _must_exist(Path(explicit), "--config")
    if env_path := os.environ.get(CONFIG_ENV):
        return _must_exist(Path(env_path), f"${CONFIG_ENV}")
    for folder in (Path.cwd(), Path.home() / ".llms"):
        for name in CONFIG_NAMES:
            if (folder / name).is_file():
                return folder / name
    raise ConfigError("no config found: pass --config, set $LLMS_CONFIG, or create ./llms.json")


def _must_exist(path: Path, origin: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found (from {origin})")
    return path


def load(path: Path, environ: Mapping[str, str] | None = None) -> Snapshot:
    """Read and resolve the config file at `path`; raises ConfigError naming file and field.

    Blocking (file I/O and parsing): the reload watcher runs it off the event loop."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: {size} bytes, over the {MAX_CONFIG_BYTES} a config file "
                              "may have")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 at byte {exc.start}") from None
    return parse(text, path, os.environ if environ is None else environ)


def parse(text: str, path: Path, environ: Mapping[str, str]) -> Snapshot:
    """Resolve config text (JSON, or YAML for .yaml/.yml) into a Snapshot."""
    data = _decode(text, path)
    try:
        file = msgspec.convert(data, _File)
    except msgspec.ValidationError as exc:
        raise _invalid(str(path), "", exc) from exc
    where = str(path)
    server = _server(file.server, where)
    keys = _keys(server.api_keys, environ)
    admin_keys = _keys(server.admin_keys, environ)
    _check_distinct(keys, admin_keys, where)
    timeouts = _merge(Timeouts(), file.defaults.timeouts, where, "defaults.timeouts")
    retries = _merge(Retries(), file.defaults.retries, where, "defaults.retries")
    circuit = _merge(CircuitPolicy(), file.defaults.circuit, where, "defaults.circuit")
    providers = tuple(
        _provider(name, raw, timeouts, retries, circuit, environ, where,
                  file.defaults.max_answer_bytes, file.defaults.stream_upstream,
                  file.defaults.max_answer_events)
        for name, raw in file.providers.items()
    )
    state = msgspec.structs.replace(file.state, url=_expand(file.state.url, environ) or "")
    telemetry = file.telemetry
    if telemetry.otlp_endpoint is not None:
        telemetry = msgspec.structs.replace(
            telemetry, otlp_endpoint=_expand(telemetry.otlp_endpoint, environ))
    default_policy = AliasPolicy(
        _routing(RoutingPolicy(), file.defaults.routing, where, "defaults.routing"),
        _merge(CachePolicy(), file.defaults.cache, where, "defaults.cache"))
    policies = {alias: AliasPolicy(
        _routing(default_policy.routing, entry.routing, where, f"models.{alias}.routing"),
        _merge(default_policy.cache, entry.cache, where, f"models.{alias}.cache"),
        entry.resume, entry.max_resumes)
        for alias, entry in file.models.items() if entry.alias_of is None}
    names, chains = _names(file.models, providers, where)
    return Snapshot(source=path, server=server, providers=providers, routes=_routes(providers),
                    state=state, keys=keys, admin_keys=admin_keys, responses=file.responses,
                    idempotency=file.idempotency,
                    default_policy=default_policy, policies=policies, names=names,
                    chains=chains, telemetry=telemetry,
                    database=_database(file.database, path, environ), batches=file.batches)


def _database(database: DatabaseConfig, path: Path, environ: Mapping[str, str]
              ) -> DatabaseConfig:
    """`database.url` expanded, or SQLite in the state directory (`state_dir`)."""
    if database.url is not None:
        url = _expand(database.url, environ)
        if not url:
            raise ConfigError(f"{path}: database.url: "
                              f"{database.url.lstrip('$').strip('{}')} is not set")
        return msgspec.structs.replace(database, url=url)
    return msgspec.structs.replace(database,
                                   url=f"sqlite:///{state_dir(environ) / 'gateway.db'}")


def state_dir(environ: Mapping[str, str]) -> Path:
    """Where the gateway keeps what outlives it: `$LLMS_STATE_DIR`, else
    `$XDG_STATE_HOME/llms-gateway` (`~/.local/state/llms-gateway`), as the pool's worker logs."""
    if explicit := environ.get(STATE_DIR_ENV):
        return Path(explicit)
    base = environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "llms-gateway"


def _names(models: Mapping[str, _AliasEntry], providers: tuple[ProviderSpec, ...], file: str
           ) -> tuple[Names, Chains]:
    """`alias_of`, patterns and `fallbacks` of `models`, checked against every alias a provider
    lists (a disabled one's too: an unset key must not make the file invalid)."""
    known = {alias for spec in providers for alias in spec.models}
    open_ended = any(spec.discovery is not None for spec in providers)
    alias_of: dict[str, str] = {}
    written: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, entry in models.items():
        if entry.alias_of is not None:
            if entry.routing or entry.cache or entry.fallbacks or entry.resume:
                raise ConfigError(f"{file}: models.{name}: an alias_of takes routing, cache "
                                  f"and fallbacks from '{entry.alias_of}'; set them there")
            alias_of[name] = entry.alias_of
        elif "*" in name:
            raise ConfigError(f"{file}: models.{name}: a pattern needs alias_of (the alias "
                              "the names it matches are served as)")
        if entry.fallbacks:
            written[name] = dict(entry.fallbacks) if isinstance(entry.fallbacks, dict) \
                else {"default": entry.fallbacks}
    try:
        names = aliases.names(alias_of, known, open_ended)
        return names, aliases.chains(written, names, known | set(names.exact), open_ended)
    except AliasError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def _decode(text: str, path: Path) -> Any:
    try:
        if path.suffix in (".yaml", ".yml"):
            try:
                return yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
            ) from exc
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config") from None


def _invalid(file: str, field: str, exc: msgspec.ValidationError) -> ConfigError:
    """A ConfigError reading "FILE: dotted.field: problem" from a msgspec error."""
    # msgspec says "Expected `int`, got `str` - at `$.timeouts.connect`"; lead with the field.
    problem, _, at = str(exc).partition(" - at `$")
    path = ".".join(part for part in (field, at.rstrip("`").lstrip(".")) if part)
    return ConfigError(f"{file}: {path}: {problem}" if path else f"{file}: {problem}")


def _server(raw: dict[str, Any], where: str) -> ServerConfig:
    try:
        return msgspec.convert(raw, ServerConfig)
    except msgspec.ValidationError as exc:
        raise _invalid(where, "server", exc) from exc


def _keys(entries: tuple[str | KeyEntry, ...], environ: Mapping[str, str]
          ) -> tuple[GatewayKey, ...]:
    """Resolve `server.api_keys`; one whose variable is unset is dropped."""
    keys = []
    for entry in entries:
        item = entry if isinstance(entry, KeyEntry) else KeyEntry(key=entry)
        secret = _expand(item.key, environ)
        if not secret:
            continue
        key_id = item.id or "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]
        keys.append(GatewayKey(Secret(secret), KeyLimits(
            key_id, item.requests_per_minute, item.tokens_per_minute, item.priority,
            item.priority if item.max_priority is None else item.max_priority, item.timeout,
            item.weight), item.private))
    return tuple(keys)


def _check_distinct(keys: tuple[GatewayKey, ...], admin_keys: tuple[GatewayKey, ...],
                    file: str) -> None:
    """ConfigError when a key is both a client and an admin key: every client holding it could
    open the admin routes. The message names the entry, never the key."""
    client = {key.secret.reveal() for key in keys}
    for key in admin_keys:
        if key.secret.reveal() in client:
            raise ConfigError(f"{file}: server.admin_keys: the key with id {key.limits.key_id} "
                              "is in server.api_keys too; an admin key must be a key of its "
                              "own, or every client holding it opens the admin routes")


def _merge(base: S, overrides: Mapping[str, Any], file: str, field: str) -> S:
    try:
        merged = msgspec.convert({**msgspec.structs.asdict(base), **overrides}, type(base))
    except msgspec.ValidationError as exc:
        raise _invalid(file, field, exc) from exc
    for name in ("connect", "first_token", "idle", "total", "attempts", "failures",
                 "window", "open_for"):
        value = getattr(merged, name, None)
        if value is not None and value <= 0:
            raise ConfigError(f"{file}: {field}.{name}: must be greater than 0, got {value}")
    return merged


def _routing(base: RoutingPolicy, overrides: Mapping[str, Any], file: str, field: str
             ) -> RoutingPolicy:
    """`routing` over `base`, its `hedge_after` a number or a quantile `hedging` can read."""
    merged = _merge(base, overrides, file, field)
    if isinstance(merged.hedge_after, str):
        try:
            hedging.quantile(merged.hedge_after)
        except ValueError as exc:
            raise ConfigError(f"{file}: {field}.hedge_after: {exc}") from None
    return merged


def _is_http_url(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _provider(name: str, raw: dict[str, Any], timeouts: Timeouts, retries: Retries,
              circuit: CircuitPolicy, environ: Mapping[str, str], file: str,
              max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
              stream_upstream: bool = True,
              max_answer_events: int = DEFAULT_MAX_ANSWER_EVENTS) -> ProviderSpec:
    where = f"providers.{name}"
    try:
        entry = msgspec.convert(raw, ProviderEntry)
    except msgspec.ValidationError as exc:
        raise _invalid(file, where, exc) from exc
    discovery = None
    if entry.models == "*":
        models: dict[str, ModelEntry] = {}
        discovery = Discovery(entry.include, entry.exclude, entry.discover_interval)
    else:
        models = {alias: _model(alias, m, file, f"{where}.models.{alias}")
                  for alias, m in entry.models.items()}
    disabled_reason = None if entry.enabled else IN_CONFIG
    api_key = _expand(entry.api_key, environ) if entry.api_key else None
    if entry.api_key and not api_key and disabled_reason is None:
        disabled_reason = f"{entry.api_key.lstrip('$').strip('{}')} is not set"
    base_url = _expand(entry.base_url, environ) if entry.base_url else None
    if entry.base_url and not base_url and disabled_reason is None:
        disabled_reason = f"{entry.base_url.lstrip('$').strip('{}')} is not set"
    if base_url and not _is_http_url(base_url):  # the value is not shown: it may hold a key
        raise ConfigError(f"{file}: {where}.base_url: must be an http:// or https:// URL "
                          "with a host")
    if base_url and api_key and urllib.parse.urlsplit(base_url).password is not None:
        # Both would be sent, and clients refuse two sets of credentials in one request.
        raise ConfigError(f"{file}: {where}.base_url: carries credentials (user:password@) "
                          "and api_key is set too: keep one")
    spec = ProviderSpec(
        name=name,
        kind=entry.type,
        base_url=base_url.rstrip("/") if base_url else None,
        api_key=Secret(api_key) if api_key else None,
        enabled=disabled_reason is None,
        disabled_reason=disabled_reason,
        models=models,
        timeouts=_merge(timeouts, entry.timeouts, file, f"{where}.timeouts"),
        retries=_merge(retries, entry.retries, file, f"{where}.retries"),
        circuit=_merge(circuit, entry.circuit, file, f"{where}.circuit"),
        headers={k: _expand(v, environ) or "" for k, v in entry.headers.items()},
        params=dict(entry.params),
        drop_params=frozenset(entry.drop_params),
        raw=raw,
        discovery=discovery,
        proxy=_proxy(entry, environ, file, where),
        tls=_tls(entry.tls, environ, file, where),
        max_answer_bytes=entry.max_answer_bytes or max_answer_bytes,
        max_answer_events=entry.max_answer_events or max_answer_events,
        max_embedding_batch=entry.max_embedding_batch,
        weight=entry.weight,
        stream_upstream=stream_upstream if entry.stream_upstream is None
        else entry.stream_upstream,
        credentials=tuple(Secret(v) for v in _credentials(raw, environ)),
    )
    if spec.base_url and spec.enabled:
        try:  # an environment proxy the transport cannot use, named with its variable
            spec.link_for(spec.base_url)
        except ValueError as exc:
            raise ConfigError(f"{file}: {where}: {exc}") from None
    return spec


# The words that name a credential among a kind's own fields (`client_secret`, `azure_ad_token`,
# `aws_secret_access_key`, `password`...).
_CREDENTIAL_WORDS = ("secret", "token", "password", "key")
_SHARED_FIELDS = frozenset(ProviderEntry.__struct_fields__)


def _credentials(raw: Mapping[str, Any], environ: Mapping[str, str]) -> list[str]:
    """The values of a kind's own credential fields (nested ones too), resolved."""
    found = []
    for name, value in raw.items():
        if name in _SHARED_FIELDS:
            continue
        if isinstance(value, Mapping):
            found += _credentials(value, environ)
        elif isinstance(value, str) and any(w in name.lower() for w in _CREDENTIAL_WORDS) \
                and (resolved := _expand(value, environ)) and len(resolved) >= 8:
            found.append(resolved)
    return found


def _proxy(entry: ProviderEntry, environ: Mapping[str, str], file: str, where: str
           ) -> str | ProxyEnvironment | None:
    """`"proxy"`: absent (or a `"$NAME"` that is unset) means the environment's, null none."""
    if entry.proxy is None:
        return None
    value = _expand(entry.proxy, environ) if isinstance(entry.proxy, str) else None
    if value is None:
        return ProxyEnvironment.read(environ)
    try:
        return check_proxy(value, f"{where}.proxy")
    except ValueError as exc:
        raise ConfigError(f"{file}: {exc}") from None


def _tls(tls: TlsEntry | None, environ: Mapping[str, str], file: str, where: str
         ) -> TlsOptions | None:
    """`"tls"` with its paths expanded (relative ones from the config file's folder), each
    file checked to exist."""
    if tls is None:
        return None
    folder = Path(file).parent
    paths: dict[str, str | None] = {}
    for field_name in ("ca_file", "cert_file", "key_file"):
        written = getattr(tls, field_name)
        value = _expand(written, environ) if written else None
        if value is not None:
            value = str(folder / Path(value).expanduser())
            if not Path(value).is_file():
                raise ConfigError(f"{file}: {where}.tls.{field_name}: no such file: {value}")
        paths[field_name] = value
    if paths["key_file"] and not paths["cert_file"]:
        raise ConfigError(f"{file}: {where}.tls.key_file: needs tls.cert_file beside it")
    return TlsOptions(paths["ca_file"], paths["cert_file"], paths["key_file"], tls.verify)


def _model(alias: str, raw: str | dict[str, Any], file: str, where: str) -> ModelEntry:
    """A model entry: an upstream id, or an object of facts about it.

    An object with a `source` (or a `served_model_name`) is a model the provider runs itself (a
    pool's): its engine options are the kind's to check, and its id is the name workers serve.
    """
    if isinstance(raw, str):
        return ModelEntry(id=raw)
    known = {k: v for k, v in raw.items() if k in ModelEntry.__struct_fields__}
    if "source" in raw or "served_model_name" in raw:
        known["id"] = raw.get("served_model_name") or raw.get("id") or alias
    elif set(raw) - set(known):
        unknown = ", ".join(sorted(set(raw) - set(known)))
        raise ConfigError(f"{file}: {where}: unknown field(s) {unknown}")
    try:
        return msgspec.convert(known, ModelEntry)
    except msgspec.ValidationError as exc:
        raise _invalid(file, where, exc) from exc


def _expand(value: str, environ: Mapping[str, str]) -> str | None:
    """`"$NAME"` or `"${NAME}"` reads the environment (None when unset); other text is literal."""
    if value.startswith("${") and value.endswith("}"):
        return environ.get(value[2:-1]) or None
    if value.startswith("$") and value[1:].replace("_", "").isalnum():
        return environ.get(value[1:]) or None
    return value


def secrets(snapshot: Snapshot) -> list[str]:
    """Every credential the config holds, resolved: the gateway's keys, providers' keys and
    header values, credentials in their URLs and proxies, in the Redis URL and in the
    collector's. What `Redactor` removes from everything that leaves the process."""
    found = [key.secret.reveal() for key in snapshot.keys + snapshot.admin_keys]
    found += url_secrets(snapshot.state.url)
    # A database URL without a password names only a user, which is no secret (and a common
    # word: "postgres"); with one, both go.
    if snapshot.database.url and urllib.parse.urlsplit(snapshot.database.url).password:
        found += url_secrets(snapshot.database.url)
    if snapshot.telemetry.otlp_endpoint:
        found += url_secrets(snapshot.telemetry.otlp_endpoint)
    for spec in snapshot.providers:
        if spec.api_key is not None:
            found.append(spec.api_key.reveal())
        found += [credential.reveal() for credential in spec.credentials]
        for value in spec.headers.values():
            found += [value, value.rsplit(" ", 1)[-1]]  # "Bearer <token>": the token alone too
        if spec.base_url:
            found += url_secrets(spec.base_url)
        if isinstance(spec.proxy, str):
            found += url_secrets(spec.proxy)
        elif isinstance(spec.proxy, ProxyEnvironment):
            found += [secret for _, url, _ in spec.proxy.entries for secret in url_secrets(url)]
    return found


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def weakening(old: Snapshot, new: Snapshot, bind_host: str, allowed_open: bool = False
              ) -> str | None:
    """Why reloading `new` over `old` would weaken the gateway, or None: a reload never turns
    authentication off (an unset or mistyped key variable resolves to no key), never leaves a
    reachable address open unless that is allowed (`allowed_open`: `--allow-unauthenticated`),
    and never leaves no provider."""
    if old.keys and not new.keys:
        return ("server.api_keys resolves to no key (is its variable unset or misspelt?) while "
                "keys are in force")
    if old.admin_keys and not new.admin_keys:
        return ("server.admin_keys resolves to no key (is its variable unset or misspelt?) "
                "while admin keys are in force")
    if not (new.keys or is_loopback(bind_host) or new.server.allow_unauthenticated
            or allowed_open):
        return f"it would serve {bind_host} without server.api_keys"
    if not new.providers:
        return "providers is empty"
    return None


def _routes(providers: tuple[ProviderSpec, ...]) -> dict[str, tuple[Route, ...]]:
    routes: dict[str, list[Route]] = {}
    for spec in providers:
        if not spec.enabled:
            continue
        for alias, model in spec.models.items():
            known = facts(model, spec.base_url)
            routes.setdefault(alias, []).append(Route(spec.name, model.id, spec.weight,
                                                      known.context_window,
                                                      known.max_output_tokens))
    return {alias: tuple(candidates) for alias, candidates in routes.items()}


def model_facts(snapshot: Snapshot) -> dict[tuple[str, str], Facts]:
    """Per (provider, alias), what is known of the upstream model and where from."""
    return {(spec.name, alias): facts(model, spec.base_url)
            for spec in snapshot.providers for alias, model in spec.models.items()}


def with_discovered(snapshot: Snapshot, found: Mapping[str, tuple[str, ...]]) -> Snapshot:
    """A copy whose discovering providers serve the models found (alias = upstream id)."""
    providers = tuple(
        replace(p, models={m: ModelEntry(id=m) for m in found.get(p.name, ())})
        if p.discovery is not None else p
        for p in snapshot.providers
    )
    return replace(snapshot, providers=providers, routes=_routes(providers))


def with_provider_disabled(snapshot: Snapshot, name: str, reason: str) -> Snapshot:
    """A copy of the snapshot with one provider disabled (a kind that cannot start, say)."""
    providers = tuple(
        replace(p, enabled=False, disabled_reason=reason) if p.name == name else p
        for p in snapshot.providers
    )
    return replace(snapshot, providers=providers, routes=_routes(providers))
