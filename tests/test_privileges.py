"""Client keys and admin keys are different things, and reading the gateway's state needs a key.

A tenant holding a client key can chat, but cannot switch providers off for everyone; an admin
key can. When keys are configured, the models list, metrics and status need one too, unless the
operator opens a path explicitly (Prometheus scraping without a token).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

CLIENT = "tenant-key-0001"
ADMIN = "admin-key-0001"
MESSAGES = [{"role": "user", "content": "hello"}]


def _bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture
def keyed(start_gateway: Callable[..., GatewayProcess],
          upstream_factory: Callable[[str], FakeUpstream]) -> GatewayProcess:
    up = upstream_factory("alpha")
    return start_gateway(config({"alpha": provider(up.base_url, {"m": "m"})},
                                server={"api_keys": [CLIENT], "admin_keys": [ADMIN]}))


def test_a_tenant_key_cannot_disable_a_provider_but_an_admin_key_can(
        keyed: GatewayProcess) -> None:
    url = f"{keyed.url}/admin/providers/alpha/disable"

    tenant = httpx.post(url, headers=_bearer(CLIENT))
    anonymous = httpx.post(url)
    admin = httpx.post(url, headers=_bearer(ADMIN))

    assert tenant.status_code == 403, tenant.text
    assert tenant.json()["error"]["code"] == "permission_denied"
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    assert admin.status_code == 200 and admin.json()["enabled"] is False


def test_an_admin_key_also_works_where_a_client_key_does(keyed: GatewayProcess) -> None:
    for key in (CLIENT, ADMIN):
        answer = httpx.post(f"{keyed.base_url}/chat/completions", headers=_bearer(key),
                            json={"model": "m", "messages": MESSAGES})
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/m", "/metrics", "/status.json"])
def test_reading_the_gateways_state_needs_a_key_when_keys_are_set(
        keyed: GatewayProcess, path: str) -> None:
    anonymous = httpx.get(f"{keyed.url}{path}")
    tenant = httpx.get(f"{keyed.url}{path}", headers=_bearer(CLIENT))
    admin = httpx.get(f"{keyed.url}{path}", headers=_bearer(ADMIN))

    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    assert tenant.status_code == 200 and admin.status_code == 200


def test_health_stays_open_and_ready_tells_details_only_to_a_key(keyed: GatewayProcess) -> None:
    health = httpx.get(f"{keyed.url}/health")
    anonymous = httpx.get(f"{keyed.url}/ready")
    tenant = httpx.get(f"{keyed.url}/ready", headers=_bearer(CLIENT))

    assert health.status_code == 200
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ready"}
    assert "alpha" not in anonymous.text
    assert [p["name"] for p in tenant.json()["providers"]] == ["alpha"]


def test_public_paths_open_metrics_to_a_scraper_without_a_key(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("alpha")
    gateway = start_gateway(config({"alpha": provider(up.base_url, {"m": "m"})},
                                   server={"api_keys": [CLIENT], "public_paths": ["/metrics"]}))

    assert httpx.get(f"{gateway.url}/metrics").status_code == 200
    assert httpx.get(f"{gateway.url}/status.json").status_code == 401


@pytest.mark.parametrize("forwarded", [{"X-Forwarded-For": "203.0.113.9"},
                                       {"Forwarded": "for=203.0.113.9"},
                                       {"X-Real-IP": "203.0.113.9"}])
def test_without_admin_keys_admin_answers_this_machine_but_not_a_forwarded_request(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], forwarded: dict[str, Any]) -> None:
    up = upstream_factory("alpha")
    gateway = start_gateway(config({"alpha": provider(up.base_url, {"m": "m"})},
                                   server={"api_keys": [CLIENT]}))

    local = httpx.get(f"{gateway.url}/admin/providers")
    relayed = httpx.post(f"{gateway.url}/admin/providers/alpha/disable",
                         headers={**forwarded, **_bearer(CLIENT)})

    assert local.status_code == 200
    assert relayed.status_code == 403, relayed.text
    assert relayed.json()["error"]["code"] == "permission_denied"
