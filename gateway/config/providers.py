"""A provider's entry in llms.json resolved: its secrets from the environment, its timeouts and
retries over the defaults, its proxy, TLS and models; disabled with a reason when its key is unset.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from gateway.config.fields import invalid, merge_over, unknown_fields
from gateway.core.settings import IN_CONFIG, ConfigError
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


def _is_http_url(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def provider(name: str, raw: dict[str, Any], timeouts: Timeouts, retries: Retries,
              circuit: CircuitPolicy, environ: Mapping[str, str], file: str,
              max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
              stream_upstream: bool = True,
              max_answer_events: int = DEFAULT_MAX_ANSWER_EVENTS) -> ProviderSpec:
    where = f"providers.{name}"
    try:
        entry = msgspec.convert(raw, ProviderEntry)
    except msgspec.ValidationError as exc:
        raise invalid(file, where, exc, ProviderEntry) from exc
    discovery = None
    if entry.models == "*":
        models: dict[str, ModelEntry] = {}
        discovery = Discovery(entry.include, entry.exclude, entry.discover_interval)
    else:
        models = {alias: _model(alias, m, file, f"{where}.models.{alias}")
                  for alias, m in entry.models.items()}
    disabled_reason = None if entry.enabled else IN_CONFIG
    api_key = expand(entry.api_key, environ) if entry.api_key else None
    if entry.api_key and not api_key and disabled_reason is None:
        disabled_reason = f"{entry.api_key.lstrip('$').strip('{}')} is not set"
    base_url = expand(entry.base_url, environ) if entry.base_url else None
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
        timeouts=merge_over(timeouts, entry.timeouts, file, f"{where}.timeouts"),
        retries=merge_over(retries, entry.retries, file, f"{where}.retries"),
        circuit=merge_over(circuit, entry.circuit, file, f"{where}.circuit"),
        headers={k: expand(v, environ) or "" for k, v in entry.headers.items()},
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
        betas=entry.betas,
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
                and (resolved := expand(value, environ)) and len(resolved) >= 8:
            found.append(resolved)
    return found


def _proxy(entry: ProviderEntry, environ: Mapping[str, str], file: str, where: str
           ) -> str | ProxyEnvironment | None:
    """`"proxy"`: absent (or a `"$NAME"` that is unset) means the environment's, null none."""
    if entry.proxy is None:
        return None
    value = expand(entry.proxy, environ) if isinstance(entry.proxy, str) else None
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
        value = expand(written, environ) if written else None
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

    An object with fields beyond `ModelEntry`'s is the kind's to check (`unknown`, once the kind
    is known): a model the provider runs itself (a pool's), whose id is the name workers serve.
    """
    if isinstance(raw, str):
        return ModelEntry(id=raw)
    known = {k: v for k, v in raw.items() if k in _MODEL_FIELDS}
    if len(known) < len(raw):
        known["id"] = raw.get("served_model_name") or raw.get("id") or alias
    try:
        return msgspec.convert(known, ModelEntry)
    except msgspec.ValidationError as exc:
        raise invalid(file, where, exc, ModelEntry) from exc


_MODEL_FIELDS = frozenset(ModelEntry.__struct_fields__)


def unknown(spec: ProviderSpec, fields: frozenset[str], model_fields: frozenset[str]
            ) -> list[str]:
    """Every field of a provider's object, and of its model objects, that neither the core nor
    its kind (`fields`, `model_fields`) reads, each with the closest known name."""
    where = f"providers.{spec.name}"
    found = unknown_fields(spec.raw, _SHARED_FIELDS | fields, where)
    models = spec.raw.get("models")
    for alias, model in models.items() if isinstance(models, dict) else ():
        if isinstance(model, dict):
            found += unknown_fields(model, _MODEL_FIELDS | model_fields,
                                    f"{where}.models.{alias}")
    return found


def expand(value: str, environ: Mapping[str, str]) -> str | None:
    """`"$NAME"` or `"${NAME}"` reads the environment (None when unset); other text is literal."""
    if value.startswith("${") and value.endswith("}"):
        return environ.get(value[2:-1]) or None
    if value.startswith("$") and value[1:].replace("_", "").isalnum():
        return environ.get(value[1:]) or None
    return value
