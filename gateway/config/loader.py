"""llms.json: find it, read it, check it, and resolve it into an immutable `Snapshot`.

The file is read into plain structs (what the user wrote), then resolved: `"$NAME"` strings read
the environment, per-provider `timeouts`/`retries` are merged over `defaults`, providers whose key
is unset are disabled with a reason, and the alias → candidates table is computed once, so the
hot path is a dict lookup. Every error names the file, the field and the problem.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from gateway.config.fields import did_you_mean, invalid, merge_over
from gateway.config.mcp import servers as mcp_servers
from gateway.config.providers import expand, provider
from gateway.config.snapshots import routes
from gateway.config.ui import ui
from gateway.core import aliases
from gateway.core.aliases import AliasError, Chains, Names
from gateway.core.limits import KeyLimits
from gateway.core.settings import (
    AliasPolicy,
    BatchesConfig,
    CachePolicy,
    ConfigError,
    DatabaseConfig,
    GatewayKey,
    IdempotencyConfig,
    KeyEntry,
    ResponsesConfig,
    RoutingPolicy,
    ServerConfig,
    Snapshot,
    StateConfig,
    Telemetry,
    quantile,
)
from gateway.core.settings.guardrails import GuardrailPolicy
from gateway.core.settings.logs import LogCapture, LogsConfig
from gateway.core.settings.mcp import McpServerEntry, McpSettings
from gateway.core.settings.realtime import RealtimeConfig
from providers.contract.spec import (
    DEFAULT_MAX_ANSWER_EVENTS,
    CircuitPolicy,
    ProviderSpec,
    Retries,
    Secret,
    Timeouts,
)
from providers.contract.transport import DEFAULT_MAX_ANSWER_BYTES
from providers.contract.usage import Price

# A config is a few KB; one this large is a mistake, and parsing it would hold a core.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
CONFIG_ENV = "LLMS_CONFIG"
# Set by `serve` for its workers: the address bound, and whether --allow-unauthenticated was given.
BIND_ENV = "LLMS_BIND_HOST"
OPEN_ENV = "LLMS_ALLOW_UNAUTHENTICATED"
STATE_DIR_ENV = "LLMS_STATE_DIR"  # where the default accounts database lives
DATABASE_FILE = "gateway.db"
WORKERS_ENV = "LLMS_WORKERS"  # set by `serve` for its workers: how many share this machine
CONFIG_NAMES = ("llms.json", "llms.yaml", "llms.yml")


class _AliasEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    routing: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    # This name (or pattern, with `*`) serves as another alias (`gateway.core.aliases`).
    alias_of: str | None = None
    # Aliases tried after this one's candidates: for any failure, or per failure class.
    fallbacks: tuple[str, ...] | dict[str, tuple[str, ...]] = ()
    resume: bool = False
    max_resumes: Annotated[int, msgspec.Meta(ge=1, le=10)] = 1
    guardrails: tuple[str, ...] = ()  # names of the file's `guardrails`
    logs: LogCapture | None = None  # what the request log keeps of its requests


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
    # What a budgeted key pays for a model with no known price: refused, or this price.
    unpriced: Literal["refuse"] | Price = "refuse"


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
    realtime: RealtimeConfig = RealtimeConfig()
    guardrails: dict[str, GuardrailPolicy] = {}
    ui: dict[str, Any] = {}  # the web console's sign-in (`gateway.config.ui`)
    logs: LogsConfig | None = None
    mcp_servers: dict[str, McpServerEntry] = {}  # upstream MCP servers (`gateway.mcp`)
    mcp: McpSettings = McpSettings()


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
        raise invalid(str(path), "", exc, _File) from exc
    where = str(path)
    server = _server(file.server, where)
    keys = _keys(server.api_keys, environ)
    admin_keys = _keys(server.admin_keys, environ)
    _check_distinct(keys, admin_keys, where)
    timeouts = merge_over(Timeouts(), file.defaults.timeouts, where, "defaults.timeouts")
    retries = merge_over(Retries(), file.defaults.retries, where, "defaults.retries")
    circuit = merge_over(CircuitPolicy(), file.defaults.circuit, where, "defaults.circuit")
    providers = tuple(
        provider(name, raw, timeouts, retries, circuit, environ, where,
                  file.defaults.max_answer_bytes, file.defaults.stream_upstream,
                  file.defaults.max_answer_events)
        for name, raw in file.providers.items()
    )
    state = msgspec.structs.replace(file.state, url=expand(file.state.url, environ) or "")
    telemetry = file.telemetry
    if telemetry.otlp_endpoint is not None:
        telemetry = msgspec.structs.replace(
            telemetry, otlp_endpoint=expand(telemetry.otlp_endpoint, environ))
    default_policy = AliasPolicy(
        _routing(RoutingPolicy(), file.defaults.routing, where, "defaults.routing"),
        merge_over(CachePolicy(), file.defaults.cache, where, "defaults.cache"))
    policies = {alias: AliasPolicy(
        _routing(default_policy.routing, entry.routing, where, f"models.{alias}.routing"),
        merge_over(default_policy.cache, entry.cache, where, f"models.{alias}.cache"),
        entry.resume, entry.max_resumes, _guardrails(entry.guardrails, file.guardrails, where,
                                                    f"models.{alias}.guardrails"),
        entry.logs.capture if entry.logs else None)
        for alias, entry in file.models.items() if entry.alias_of is None}
    names, chains = _names(file.models, providers, where)
    _embedding_aliases(default_policy, policies, providers, names, where)
    snapshot = Snapshot(source=path, server=server, providers=providers, routes=routes(providers),
                    state=state, keys=keys, admin_keys=admin_keys, responses=file.responses,
                    idempotency=file.idempotency,
                    default_policy=default_policy, policies=policies, names=names,
                    chains=chains, telemetry=telemetry,
                    database=_database(file.database, path, environ), batches=file.batches,
                    unpriced=_unpriced(file.defaults.unpriced, where),
                    realtime=file.realtime, guardrails=file.guardrails,
                    ui=ui(file.ui, where, environ), document=data, logs=file.logs,
                    mcp_servers=mcp_servers(file.mcp_servers, file.mcp, environ, where),
                    mcp=file.mcp)
    _judges(snapshot, where)
    return snapshot


def _judges(snapshot: Snapshot, file: str) -> None:
    """Each guardrail's judge is an alias the gateway serves."""
    for name, policy in snapshot.guardrails.items():
        alias = policy.judge.alias if policy.judge is not None else None
        if alias is not None and snapshot.resolve(alias) not in snapshot.routes:
            raise ConfigError(f"{file}: guardrails.{name}.judge.alias: no model named "
                              f"{alias!r}{did_you_mean(alias, snapshot.routes)}")


def _guardrails(names: tuple[str, ...], known: Mapping[str, GuardrailPolicy], file: str,
                field: str) -> tuple[str, ...]:
    """An alias's guardrails, each a policy of the file's `guardrails`."""
    for name in names:
        if name not in known:
            raise ConfigError(f"{file}: {field}: no guardrail named {name!r} in `guardrails`"
                              f"{did_you_mean(name, known)}")
    return tuple(dict.fromkeys(names))


def _embedding_aliases(default: AliasPolicy, policies: Mapping[str, AliasPolicy],
                       providers: tuple[ProviderSpec, ...], names: Names, file: str) -> None:
    """Every `cache.semantic.embedding_alias` names a model some provider lists (unless one
    discovers its models): a typo there would make every lookup a miss, silently."""
    if any(spec.discovery is not None for spec in providers):
        return
    known = {alias for spec in providers for alias in spec.models} | set(names.exact)
    for where, policy in (("defaults", default), *((f"models.{a}", p)
                                                    for a, p in policies.items())):
        semantic = policy.cache.semantic
        if semantic is not None and semantic.embedding_alias not in known:
            raise ConfigError(f"{file}: {where}.cache.semantic.embedding_alias: no provider "
                              f"serves '{semantic.embedding_alias}'")


def _unpriced(policy: Literal["refuse"] | Price, where: str) -> Price | None:
    """`defaults.unpriced` as the accounts read it: None refuses; a stated price is no less
    than nothing."""
    if not isinstance(policy, Price):
        return None
    if min(policy.input, policy.output, policy.cached_input or 0.0,
           policy.cache_write or 0.0) < 0:
        raise ConfigError(f"{where}: defaults.unpriced: a price is dollars per million tokens, "
                          "0 or more")
    return policy


def _database(database: DatabaseConfig, path: Path, environ: Mapping[str, str]
              ) -> DatabaseConfig:
    """`database.url` expanded, or SQLite in the state directory (`state_dir`)."""
    if database.url is not None:
        url = expand(database.url, environ)
        if not url:
            raise ConfigError(f"{path}: database.url: "
                              f"{database.url.lstrip('$').strip('{}')} is not set")
        return msgspec.structs.replace(database, url=url)
    return msgspec.structs.replace(database,
                                   url=f"sqlite:///{state_dir(environ, path) / DATABASE_FILE}")


def state_dir(environ: Mapping[str, str], config: Path) -> Path:
    """Where the gateway of the config file `config` keeps what outlives it (its accounts
    database, budget counts, pool workers' logs and lock): `$LLMS_STATE_DIR`, else a folder of
    its own under `users_state_dir`, named for the file's folder and its absolute path, so that
    two checkouts or two configs never share keys, spend or pool workers."""
    if explicit := environ.get(STATE_DIR_ENV):
        return Path(explicit)
    where = config.absolute()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", where.parent.name).strip("-.")[:40] or "config"
    return users_state_dir(environ) / f"{name}-{hashlib.sha256(bytes(where)).hexdigest()[:12]}"


def users_state_dir(environ: Mapping[str, str]) -> Path:
    """`$XDG_STATE_HOME/llms-gateway` (`~/.local/state/llms-gateway`): every gateway's state
    folder is in it (earlier gateways kept one database there, shared by all of a user's)."""
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
            if entry.routing or entry.cache or entry.fallbacks or entry.resume \
                    or entry.guardrails or entry.logs:
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


def _server(raw: dict[str, Any], where: str) -> ServerConfig:
    try:
        return msgspec.convert(raw, ServerConfig)
    except msgspec.ValidationError as exc:
        raise invalid(where, "server", exc, ServerConfig) from exc


def _keys(entries: tuple[str | KeyEntry, ...], environ: Mapping[str, str]
          ) -> tuple[GatewayKey, ...]:
    """Resolve `server.api_keys`; one whose variable is unset is dropped."""
    keys = []
    for entry in entries:
        item = entry if isinstance(entry, KeyEntry) else KeyEntry(key=entry)
        secret = expand(item.key, environ)
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


def _routing(base: RoutingPolicy, overrides: Mapping[str, Any], file: str, field: str
             ) -> RoutingPolicy:
    """`routing` over `base`, its `hedge_after` a number or a quantile `hedging` can read."""
    merged = merge_over(base, overrides, file, field)
    if isinstance(merged.hedge_after, str):
        try:
            quantile(merged.hedge_after)
        except ValueError as exc:
            raise ConfigError(f"{file}: {field}.hedge_after: {exc}") from None
    return merged


