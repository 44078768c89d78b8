"""What a provider kind is built from: one provider's resolved entry in llms.json.

`gateway.config.loader` reads and checks the file and resolves these; a kind only reads them. Values
are frozen: a config reload builds new ones, it never changes these in place.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from providers.contract.transport import (
    DEFAULT_MAX_ANSWER_BYTES,
    Link,
    ProxyEnvironment,
    TlsOptions,
)
from providers.contract.usage import Price

# Events of one stream assembled into a whole answer: far more than the longest answer a model
# writes (an event a token), few enough that a lying upstream cannot hold a request for long.
DEFAULT_MAX_ANSWER_EVENTS = 500_000


class Timeouts(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Seconds allowed for each phase of an upstream exchange."""

    connect: float = 5.0
    first_token: float = 60.0
    idle: float = 60.0
    total: float = 600.0


class Retries(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Tries per candidate before moving to the next one."""

    attempts: int = 1
    backoff: float = 0.25
    max_backoff: float = 8.0
    retry_after_cap: float = 30.0
    # The longest an upstream's Retry-After is believed (cooldowns, the hint relayed to
    # clients): one answer must not take a provider out of service for longer.
    max_retry_after: Annotated[float, msgspec.Meta(gt=0)] = 60.0


class CircuitPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When a breaker opens and for how long; `circuit` in llms.json."""

    enabled: bool = True
    failures: int = 5
    error_rate: float = 0.5
    window: float = 60.0
    min_requests: int = 10
    open_for: float = 5.0
    max_open_for: float = 300.0
    rate_limit_cooldown: float = 1.0


class ModelEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model as one provider serves it: its upstream id and facts about it."""

    id: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    price: Price | None = None
    realtime: bool = False  # it serves the Realtime API (`/v1/realtime`, a WebSocket)


class TlsEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`"tls"` as written: file paths may be `"$NAME"`."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


class ProviderEntry(msgspec.Struct, frozen=True):
    """The fields every provider kind shares; kinds read their own extras from `raw`."""

    type: str
    base_url: str | None = None
    api_key: str | None = None
    enabled: bool = True
    models: dict[str, str | dict[str, Any]] | Literal["*"] = {}
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    discover_interval: float = 300.0
    timeouts: dict[str, Any] = {}
    retries: dict[str, Any] = {}
    circuit: dict[str, Any] = {}
    headers: dict[str, str] = {}
    params: dict[str, Any] = {}
    drop_params: tuple[str, ...] = ()
    # Absent (UNSET): the environment's proxy; null: none; a URL: that one.
    proxy: str | msgspec.UnsetType | None = msgspec.UNSET
    tls: TlsEntry | None = None
    max_answer_bytes: Annotated[int, msgspec.Meta(gt=0)] | None = None
    max_answer_events: Annotated[int, msgspec.Meta(gt=0)] | None = None
    # Inputs per upstream embeddings call; larger batches are split (the kind's own default
    # when absent).
    max_embedding_batch: Annotated[int, msgspec.Meta(gt=0)] | None = None
    # Its share of first tries for aliases routed `weighted`.
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Whether a whole-answer request goes upstream as a stream (for early failover); absent:
    # `defaults.stream_upstream`.
    stream_upstream: bool | None = None
    # Paths `/passthrough/{provider}/{path}` may relay (fnmatch patterns), read from `raw` by
    # `gateway.edge.passthrough`; typed here so a wrong one is a config error.
    passthrough: tuple[str, ...] = ()
    # The client `anthropic-beta` values an `anthropic` provider forwards (fnmatch patterns):
    # a beta switches features on the operator's key, premium ones included, so none is
    # forwarded unless listed here; the others are dropped from what goes upstream.
    betas: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in self.passthrough:
            if not pattern.startswith("/"):
                raise ValueError(f"passthrough path {pattern!r} must start with '/'")
        for beta in self.betas:
            if not beta or "," in beta or beta != beta.strip():
                raise ValueError(f"betas: {beta!r} is not a beta name (one name or pattern, "
                                 "no commas or spaces)")


class Secret:
    """A credential: its repr never shows the value, so it cannot leak through a log line."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One provider, resolved: what a provider kind is built from."""

    name: str
    kind: str
    base_url: str | None
    api_key: Secret | None
    enabled: bool
    disabled_reason: str | None
    models: Mapping[str, ModelEntry]
    timeouts: Timeouts
    retries: Retries
    circuit: CircuitPolicy
    headers: Mapping[str, str]
    params: Mapping[str, Any]
    drop_params: frozenset[str]
    raw: Mapping[str, Any] = field(repr=False)
    discovery: Discovery | None = None
    # A proxy URL (may hold credentials: kept out of the repr), None to go direct, or the
    # environment's settings, resolved per URL.
    proxy: str | ProxyEnvironment | None = field(default=None, repr=False)
    tls: TlsOptions | None = None
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    # The most events a whole answer assembled from a stream may have (`gateway.adapters.assemble`).
    max_answer_events: int = DEFAULT_MAX_ANSWER_EVENTS
    max_embedding_batch: int | None = None
    weight: float = 1.0
    stream_upstream: bool = True
    # Credentials a kind reads from its own fields (an Entra secret, an AWS key), resolved: the
    # redactor removes them from everything that leaves, as it does `api_key`.
    credentials: tuple[Secret, ...] = field(default=(), repr=False)
    # The client betas it forwards (`ProviderEntry.betas`), as patterns.
    betas: tuple[str, ...] = ()

    def forwarded(self, header: str | None) -> list[str]:
        """The betas of a client's `anthropic-beta` header this provider lets through."""
        return [beta for beta in betas_in(header)
                if any(fnmatch.fnmatchcase(beta, pattern) for pattern in self.betas)]

    def link_for(self, url: str | None) -> Link:
        """How to reach `url` for this provider: its proxy (from llms.json, or the environment's
        for that URL unless NO_PROXY says direct), TLS options and answer cap. With no URL the
        environment is not consulted. ValueError when the proxy cannot be used."""
        proxy = self.proxy
        if isinstance(proxy, ProxyEnvironment):
            proxy = proxy.proxy_for(url) if url else None
        return Link(proxy, self.tls, self.max_answer_bytes)


def betas_in(header: str | None) -> list[str]:
    """The beta names an `anthropic-beta` header holds, once each, in its order."""
    if not header:
        return []
    return list(dict.fromkeys(b.strip() for b in header.split(",") if b.strip()))


@dataclass(frozen=True, slots=True)
class Discovery:
    """`"models": "*"`: list the provider's models, keep those the patterns allow."""

    include: tuple[str, ...]
    exclude: tuple[str, ...]
    interval: float

    def keeps(self, model: str) -> bool:
        """Whether a listed model is served: matches an include (if any) and no exclude."""
        if self.include and not any(fnmatch.fnmatchcase(model, p) for p in self.include):
            return False
        return not any(fnmatch.fnmatchcase(model, p) for p in self.exclude)


