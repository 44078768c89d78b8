"""A key is a client key or an admin key, never both: the same key in `server.api_keys` and
`server.admin_keys` would let every client holding it open `/admin/*`. A gateway refuses to
start with such a config, and a reload to one keeps the last good config."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gateway import config as gateway_config
from gateway.core.settings import ConfigError
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

CLIENT, ADMIN = "client-key-0000001", "admin-key-00000001"


def _doc(upstream: FakeUpstream, admin_keys: list[str]) -> dict[str, object]:
    return config({"a": provider(upstream.base_url, {"m": "m"})},
                  server={"api_keys": ["$CLIENT_KEY"], "admin_keys": admin_keys})


def _disable(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(f"{gateway.url}/admin/providers/a/disable",
                      headers={"Authorization": f"Bearer {key}"})


def test_a_key_in_both_lists_is_refused_naming_the_field_not_the_key() -> None:
    text = ('{"server": {"api_keys": ["$K", "other-client-key"], "admin_keys": ["$K"]},'
            ' "providers": {}}')
    with pytest.raises(ConfigError) as caught:
        gateway_config.parse(text, Path("/etc/llms.json"), {"K": CLIENT})

    assert "server.admin_keys" in str(caught.value) and "server.api_keys" in str(caught.value)
    assert CLIENT not in str(caught.value)


def test_a_gateway_does_not_start_with_a_client_key_that_is_also_an_admin_key(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("a")
    with pytest.raises(RuntimeError) as caught:
        start_gateway(_doc(upstream, ["$CLIENT_KEY"]), env={"CLIENT_KEY": CLIENT})

    assert "server.admin_keys" in str(caught.value)
    assert CLIENT not in str(caught.value)


def test_a_reload_that_makes_a_client_key_an_admin_key_keeps_the_last_good_config(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("a")
    gateway = start_gateway(_doc(upstream, [ADMIN]), env={"CLIENT_KEY": CLIENT})
    assert _disable(gateway, CLIENT).status_code == 403

    gateway.write_config(_doc(upstream, [ADMIN, "$CLIENT_KEY"]))
    refused = gateway.wait_for_log("config_reload_failed")[-1]

    assert refused["level"] == "error" and "server.admin_keys" in refused["error"]
    assert CLIENT not in gateway.logs()
    denied = _disable(gateway, CLIENT)
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "permission_denied"
    assert _disable(gateway, ADMIN).status_code == 200
