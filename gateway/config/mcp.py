"""`mcp_servers` in llms.json resolved: each server's secrets from the environment (`"$NAME"`,
as providers), its kind (remote `url` or spawned `command`) checked, its name fit for a prefix of
tool names."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping

import msgspec

from gateway.config.providers import expand
from gateway.core.settings import ConfigError
from gateway.core.settings.mcp import SERVER_NAME, McpServer, McpServerEntry, McpSettings
from providers.contract.redact import url_secrets
from providers.contract.spec import Secret

_NAME = re.compile(SERVER_NAME)


def servers(entries: Mapping[str, McpServerEntry], settings: McpSettings,
            environ: Mapping[str, str], file: str) -> tuple[McpServer, ...]:
    """The enabled servers of `mcp_servers`, resolved; a ConfigError names the field."""
    resolved = []
    for name, entry in entries.items():
        where = f"{file}: mcp_servers.{name}"
        if not _NAME.fullmatch(name) or settings.separator in name:
            raise ConfigError(f"{where}: a server's name is the prefix of its tools' names: "
                              "up to 32 letters, digits and '-', without the separator "
                              f"'{settings.separator}'")
        if (entry.url is None) == (entry.command is None):
            raise ConfigError(f"{where}: give either `url` (a streamable-HTTP server) or "
                              "`command` (a local server the gateway spawns), not both")
        if entry.enabled:
            resolved.append(_server(name, entry, environ, where))
    return tuple(resolved)


def _server(name: str, entry: McpServerEntry, environ: Mapping[str, str], where: str
            ) -> McpServer:
    if entry.command is not None:
        if not entry.command or not entry.command[0]:
            raise ConfigError(f"{where}.command: the program to run, then its arguments")
        if entry.headers or entry.oauth is not None:
            raise ConfigError(f"{where}: `headers` and `oauth` are for a remote server (`url`)")
        return McpServer(name, command=entry.command, timeout=entry.timeout,
                         env=tuple((k, _needed(v, environ, f"{where}.env.{k}"))
                                   for k, v in entry.env.items()),
                         max_result_bytes=entry.max_result_bytes, price=entry.price,
                         tool_prices=tuple(entry.tool_prices.items()))
    assert entry.url is not None
    url = _needed(entry.url, environ, f"{where}.url")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}.url: an http(s) URL, got {url[:100]!r}")
    if entry.env:
        raise ConfigError(f"{where}.env: is for a spawned server (`command`)")
    oauth = entry.oauth
    if oauth is not None:
        oauth = msgspec.structs.replace(
            oauth, client_secret=_needed(oauth.client_secret, environ,
                                         f"{where}.oauth.client_secret"),
            client_id=_needed(oauth.client_id, environ, f"{where}.oauth.client_id"),
            token_url=_needed(oauth.token_url, environ, f"{where}.oauth.token_url"))
    headers = tuple((k, Secret(_needed(v, environ, f"{where}.headers.{k}")))
                    for k, v in entry.headers.items())
    return McpServer(name, url=url, headers=headers, oauth=oauth, timeout=entry.timeout,
                     max_result_bytes=entry.max_result_bytes, price=entry.price,
                     tool_prices=tuple(entry.tool_prices.items()))


def _needed(value: str, environ: Mapping[str, str], where: str) -> str:
    """`value` expanded; a variable that is unset is a ConfigError naming it."""
    found = expand(value, environ)
    if found is None:
        raise ConfigError(f"{where}: {value.lstrip('$').strip('{}')} is not set")
    return found


def secrets(found: tuple[McpServer, ...]) -> list[str]:
    """The credentials MCP servers hold: header values (a bearer's token alone too), OAuth
    client secrets, environment values given to spawned servers."""
    out: list[str] = []
    for server in found:
        for _, value in server.headers:
            out += [value.reveal(), value.reveal().rsplit(" ", 1)[-1]]
        if server.oauth is not None:
            out.append(server.oauth.client_secret)
        out += [value for _, value in server.env]
        if server.url is not None:
            out += url_secrets(server.url)
    return out
