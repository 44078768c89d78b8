"""What is worked out from a resolved config: its secrets (for redaction), whether a new one
weakens auth, its alias → candidates table, its model facts, and the snapshots a runtime derives
(discovered models, providers disabled).
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Mapping
from dataclasses import replace

from gateway.config.mcp import secrets as mcp_secrets
from gateway.core.facts import Facts, Unpriced, facts, siblings_filled
from gateway.core.settings import Route, Snapshot
from providers.contract.redact import url_secrets
from providers.contract.spec import ModelEntry, ProviderSpec
from providers.contract.transport import ProxyEnvironment
from providers.contract.usage import Price


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
    return found + mcp_secrets(snapshot.mcp_servers)


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
    and never leaves nothing to serve (no provider, no MCP server)."""
    if old.keys and not new.keys:
        return ("server.api_keys resolves to no key (is its variable unset or misspelt?) while "
                "keys are in force")
    if old.admin_keys and not new.admin_keys:
        return ("server.admin_keys resolves to no key (is its variable unset or misspelt?) "
                "while admin keys are in force")
    if not (new.keys or is_loopback(bind_host) or new.server.allow_unauthenticated
            or allowed_open):
        return f"it would serve {bind_host} without server.api_keys"
    if not new.providers and not new.mcp_servers:  # a gateway of tools alone serves some
        return "providers is empty"
    return None


def routes(providers: tuple[ProviderSpec, ...]) -> dict[str, tuple[Route, ...]]:
    routes: dict[str, list[Route]] = {}
    for spec in providers:
        if not spec.enabled:
            continue
        known = provider_facts(spec)
        for alias, model in spec.models.items():
            routes.setdefault(alias, []).append(Route(
                spec.name, model.id, spec.weight, known[alias].context_window,
                known[alias].max_output_tokens))
    return {alias: tuple(candidates) for alias, candidates in routes.items()}


def provider_facts(spec: ProviderSpec) -> dict[str, Facts]:
    """Per alias of `spec`, what is known of its upstream model: an alias that leaves a number
    out takes it from another alias of the provider naming the same upstream model, so a short
    name for a priced model is priced as that model (never served free under a budget)."""
    own = {alias: facts(model, spec.base_url) for alias, model in spec.models.items()}
    by_model: dict[str, list[str]] = {}
    for alias, model in spec.models.items():
        by_model.setdefault(model.id, []).append(alias)
    return {alias: siblings_filled(own[alias], [own[a] for a in by_model[model.id]])
            for alias, model in spec.models.items()}


def model_facts(snapshot: Snapshot) -> dict[tuple[str, str], Facts]:
    """Per (provider, alias), what is known of the upstream model and where from."""
    return {(spec.name, alias): known for spec in snapshot.providers
            for alias, known in provider_facts(spec).items()}


def prices(snapshot: Snapshot) -> tuple[dict[tuple[str, str], Price], tuple[Unpriced, ...]]:
    """Per (provider, alias) its price, and the routes with no price of their own: with
    `defaults.unpriced` a price, those are priced at it; with "refuse" they are left out, for
    the accounts to refuse to a budgeted key."""
    known = {served: found.price for served, found in model_facts(snapshot).items()
             if found.price is not None}
    unpriced = tuple(Unpriced(alias, route.provider, route.upstream_model)
                     for alias, candidates in snapshot.routes.items() for route in candidates
                     if (route.provider, alias) not in known)
    if snapshot.unpriced is not None:
        known.update({(u.provider, u.alias): snapshot.unpriced for u in unpriced})
    return known, unpriced


def with_discovered(snapshot: Snapshot, found: Mapping[str, tuple[str, ...]]) -> Snapshot:
    """A copy whose discovering providers serve the models found (alias = upstream id)."""
    providers = tuple(
        replace(p, models={m: ModelEntry(id=m) for m in found.get(p.name, ())})
        if p.discovery is not None else p
        for p in snapshot.providers
    )
    return replace(snapshot, providers=providers, routes=routes(providers))


def with_provider_disabled(snapshot: Snapshot, name: str, reason: str) -> Snapshot:
    """A copy of the snapshot with one provider disabled (a kind that cannot start, say)."""
    providers = tuple(
        replace(p, enabled=False, disabled_reason=reason) if p.name == name else p
        for p in snapshot.providers
    )
    return replace(snapshot, providers=providers, routes=routes(providers))
