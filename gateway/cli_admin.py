"""How the CLI reaches a running gateway's admin API: where it answers, with which admin key,
and its refusals as one line a shell can print."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway import cli_ls, config
from gateway.core.settings import ConfigError

ADMIN_KEY_ENV = "LLMS_ADMIN_KEY"


class AdminError(Exception):
    """The gateway refused a call (its envelope's message), or could not be reached."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where the gateway's admin API answers, and the key it is sent."""

    root: str
    admin_key: str | None
    direct: bool  # the config's own address, this machine: past any proxy of the environment

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             query: dict[str, str] | None = None) -> Any:
        """The JSON answer to one admin call; AdminError with the envelope's message."""
        url = f"{self.root}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": "application/json"}
        if self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        handlers = [urllib.request.ProxyHandler({})] if self.direct else []
        try:
            with urllib.request.build_opener(*handlers).open(request, timeout=30) as answer:
                return json.load(answer)
        except urllib.error.HTTPError as exc:
            raise AdminError(_refusal(exc)) from None
        except (OSError, ValueError) as exc:
            raise AdminError(f"no gateway answering at {self.root} ({exc}): start it "
                             "(llms-gateway serve) or point --url at it") from None


def _refusal(error: urllib.error.HTTPError) -> str:
    """What the gateway said: its envelope's message, and for a key it refused, the hint."""
    try:
        message = str(json.load(error)["error"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        message = f"HTTP {error.code}"
    if error.code in (401, 403):
        message += f" (an admin key: --admin-key or ${ADMIN_KEY_ENV})"
    return f"the gateway answered {error.code}: {message}"


def target(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Target:
    """The gateway and admin key a command uses (see the module's docstring for the order)."""
    key = args.admin_key or environ.get(ADMIN_KEY_ENV) or None
    if args.url and (key or args.config is None):
        snapshot = _config_or_none(args.config) if key is None else None
    else:
        snapshot = config.load(config.discover(args.config))
    if key is None and snapshot is not None and snapshot.admin_keys:
        key = snapshot.admin_keys[0].secret.reveal()
    if args.url:
        return Target(_root(args.url), key, direct=False)
    assert snapshot is not None
    return Target(_root(cli_ls.local_url(snapshot)), key, direct=True)


def _config_or_none(path: str | None) -> config.Snapshot | None:
    """The config for its admin key when `--url` names the gateway: none found is no error."""
    try:
        return config.load(config.discover(path))
    except ConfigError:
        return None


def _root(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")
