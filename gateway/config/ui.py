"""`ui` in llms.json: the console's sign-in, checked (an issuer reached over `https`, or `http`
on this machine only, where no one between can read the tokens)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from gateway.config.fields import invalid
from gateway.config.providers import expand
from gateway.config.snapshots import is_loopback
from gateway.core.settings import ConfigError
from gateway.core.settings.console import UiConfig


def ui(raw: Mapping[str, Any], where: str, environ: Mapping[str, str]) -> UiConfig:
    """`ui` resolved: the client secret read from the environment, the issuer's URL checked."""
    try:
        parsed = msgspec.convert(dict(raw), UiConfig)
    except msgspec.ValidationError as exc:
        raise invalid(where, "ui", exc, UiConfig) from exc
    oidc = parsed.oidc
    if oidc is None:
        return parsed
    problem = url_problem(oidc.issuer)
    if problem:
        raise ConfigError(f"{where}: ui.oidc.issuer: {problem}")
    if oidc.redirect_uri is not None and (problem := url_problem(oidc.redirect_uri)):
        raise ConfigError(f"{where}: ui.oidc.redirect_uri: {problem}")
    secret = expand(oidc.client_secret, environ) if oidc.client_secret else ""
    if oidc.client_secret and not secret:
        raise ConfigError(f"{where}: ui.oidc.client_secret: "
                          f"{oidc.client_secret.lstrip('$').strip('{}')} is not set")
    return msgspec.structs.replace(parsed, oidc=msgspec.structs.replace(
        oidc, client_secret=secret or "", issuer=oidc.issuer.rstrip("/")))


def url_problem(url: str) -> str | None:
    """Why `url` may not carry sign-in traffic, or None: `https`, or `http` to a loopback
    host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return f"{url[:200]!r} is not a URL"
    if not host:
        return f"{url[:200]!r} is not a URL"
    if parts.scheme == "https" or (parts.scheme == "http" and is_loopback(host)):
        return None
    return (f"{url[:200]!r} must be https (http is allowed on this machine's loopback only: "
            "tokens would cross the network in the clear)")
