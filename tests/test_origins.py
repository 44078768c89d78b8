"""A web page the user visits cannot drive a gateway on their machine: a request carrying an
`Origin` not in `server.cors_origins`, or, on a loopback bind, a `Host` that is not one of the
gateway's names (DNS rebinding), is refused with 403 before anything is relayed or changed.
curl and the SDKs send no `Origin` and keep working; an allowed origin keeps working."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

EVIL = "https://evil.example"
APP = "http://app.example"
HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "spend my credits"}]}'


def _refused(answer: httpx.Response, param: str) -> None:
    assert answer.status_code == 403, answer.text
    error = answer.json()["error"]
    assert error["code"] == "permission_denied" and error["param"] == param


def _providers(gateway: GatewayProcess) -> dict[str, Any]:
    listed = httpx.get(f"{gateway.url}/admin/providers").json()
    return {p["name"]: p["enabled"] for p in listed["providers"]}


@pytest.fixture
def local(start_gateway: Callable[..., GatewayProcess],
          upstream_factory: Callable[[str], FakeUpstream]) -> tuple[GatewayProcess, FakeUpstream]:
    up = upstream_factory("up")
    return start_gateway(config({"up": provider(up.base_url, {"m": "m"})})), up


def test_a_web_page_cannot_disable_a_provider_of_a_gateway_without_admin_keys(
        local: tuple[GatewayProcess, FakeUpstream]) -> None:
    gateway, _ = local

    _refused(httpx.post(f"{gateway.url}/admin/providers/up/disable",
                        headers={"Origin": EVIL}), "Origin")

    assert _providers(gateway) == {"up": True}
    assert httpx.post(f"{gateway.url}/admin/providers/up/disable").status_code == 200, \
        "this machine's curl still may"
    assert _providers(gateway) == {"up": False}


def test_a_plain_text_post_from_a_web_page_spends_no_credits(
        local: tuple[GatewayProcess, FakeUpstream]) -> None:
    gateway, up = local

    answer = httpx.post(f"{gateway.base_url}/chat/completions", content=CHAT,
                        headers={"Origin": EVIL, "Content-Type": "text/plain"})

    _refused(answer, "Origin")
    assert up.requests == []
    assert httpx.post(f"{gateway.base_url}/chat/completions", json=HI).status_code == 200


def test_a_rebound_host_name_is_refused_and_the_loopback_names_are_answered(
        local: tuple[GatewayProcess, FakeUpstream]) -> None:
    gateway, up = local
    url = f"{gateway.base_url}/chat/completions"

    _refused(httpx.post(url, json=HI, headers={"Host": f"evil.example:{gateway.port}"}), "Host")
    _refused(httpx.get(f"{gateway.url}/status.json", headers={"Host": "evil.example"}), "Host")
    assert up.requests == []
    for name in ("localhost", f"localhost:{gateway.port}", "127.0.0.1", f"[::1]:{gateway.port}"):
        assert httpx.post(url, json=HI, headers={"Host": name}).status_code == 200, name


def test_the_gateways_own_pages_and_an_allowed_origin_keep_working(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})},
                                   server={"cors_origins": [APP]}))
    url = f"{gateway.base_url}/chat/completions"

    allowed = httpx.post(url, json=HI, headers={"Origin": APP})
    own = httpx.post(url, json=HI, headers={"Origin": gateway.url})
    stranger = httpx.post(url, content=CHAT, headers={"Origin": EVIL,
                                                      "Content-Type": "text/plain"})

    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP
    assert own.status_code == 200
    _refused(stranger, "Origin")
    assert "access-control-allow-origin" not in stranger.headers
    assert len(up.requests) == 2, "the stranger's request was not relayed"
