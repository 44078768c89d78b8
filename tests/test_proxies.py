"""Behind a corporate proxy: the environment's HTTPS_PROXY / HTTP_PROXY / NO_PROXY are honoured
as curl and requests honour them, a provider's "proxy" overrides them, and a proxy's password
never shows.

The proxy is real (`tests.forward_proxy`), on loopback. Upstreams are named `upstream.test`,
a name only the proxy can resolve: an answer proves the request went through it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.forward_proxy import ForwardProxy
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PASSWORD = "s3cret-proxy-pass"


@pytest.fixture
def proxy() -> Iterator[ForwardProxy]:
    with ForwardProxy(hosts={"upstream.test": "127.0.0.1"}) as running:
        yield running


def _ask(gateway: GatewayProcess, body: dict[str, Any] = CHAT) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=20)


def _only_via_proxy(upstream: FakeUpstream, scheme: str = "http") -> str:
    return f"{scheme}://upstream.test:{upstream.port}/v1"


def test_http_proxy_from_the_environment_carries_requests_to_an_http_upstream(
        start_gateway: Callable[..., GatewayProcess], proxy: ForwardProxy,
        primary: FakeUpstream) -> None:
    primary.reset()
    doc = config({"remote": provider(_only_via_proxy(primary), {"m": "m"})})
    gateway = start_gateway(doc, env={"HTTP_PROXY": proxy.url})

    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Hello from primary"
    assert [(r.method, r.target) for r in proxy.relayed] == [
        ("POST", f"http://upstream.test:{primary.port}/v1/chat/completions")]
    assert primary.requests[0].headers["authorization"] == "Bearer sk-test-secret-123456"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _tls_upstream(ca: trustme.CA, *names: str, client_ca: trustme.CA | None = None
                  ) -> FakeUpstream:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        client_ca.configure_trust(context)
    return FakeUpstream(name="tls", tls=context).start()


def test_https_proxy_from_the_environment_tunnels_to_an_https_upstream(
        start_gateway: Callable[..., GatewayProcess], proxy: ForwardProxy, ca: trustme.CA,
        tmp_path: Path) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    secure = _tls_upstream(ca, "upstream.test")
    try:
        doc = config({"remote": provider(_only_via_proxy(secure, "https"), {"m": "m"},
                                         tls={"ca_file": str(tmp_path / "ca.pem")})})
        # HTTP_PROXY is for http URLs only: were it used here, the request would fail.
        gateway = start_gateway(doc, env={"HTTPS_PROXY": proxy.url,
                                          "HTTP_PROXY": f"http://127.0.0.1:{free_port()}"})
        answer = _ask(gateway)
    finally:
        secure.stop()

    assert answer.status_code == 200, answer.text
    assert [(r.method, r.target) for r in proxy.relayed] == [
        ("CONNECT", f"upstream.test:{secure.port}")]
    assert secure.requests[0].headers["authorization"] == "Bearer sk-test-secret-123456"


def test_no_proxy_sends_its_hosts_direct(
        start_gateway: Callable[..., GatewayProcess], proxy: ForwardProxy,
        primary: FakeUpstream) -> None:
    primary.reset()
    doc = config({"local": provider(primary.base_url, {"m": "m"})})
    gateway = start_gateway(doc, env={"HTTP_PROXY": proxy.url,
                                      "NO_PROXY": "localhost,127.0.0.0/8"})

    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert proxy.relayed == []
    assert len(primary.requests) == 1


def test_a_dead_proxy_fails_the_provider_over_instead_of_going_direct(
        start_gateway: Callable[..., GatewayProcess], primary: FakeUpstream,
        secondary: FakeUpstream) -> None:
    primary.reset()
    secondary.reset()
    doc = config({"behind-proxy": provider(primary.base_url, {"m": "m"}),
                  "direct": provider(secondary.base_url, {"m": "m"}, proxy=None)})
    gateway = start_gateway(doc, env={"HTTP_PROXY": f"http://127.0.0.1:{free_port()}"})

    answer = _ask(gateway)

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "direct"
    assert primary.requests == [], "the proxy was down: nothing may reach the upstream around it"
    failed = gateway.wait_for_log("request")[-1]["failed"]
    assert failed == ["behind-proxy:unavailable"]


def test_a_providers_own_proxy_overrides_the_environment_and_null_goes_direct(
        start_gateway: Callable[..., GatewayProcess], proxy: ForwardProxy,
        primary: FakeUpstream, secondary: FakeUpstream) -> None:
    primary.reset()
    secondary.reset()
    dead = f"http://127.0.0.1:{free_port()}"
    doc = config({
        "via-own-proxy": provider(_only_via_proxy(primary), {"a": "a"}, proxy=proxy.url),
        "no-proxy": provider(secondary.base_url, {"b": "b"}, proxy=None),
    })
    gateway = start_gateway(doc, env={"HTTP_PROXY": dead, "HTTPS_PROXY": dead,
                                      "ALL_PROXY": dead})

    through = _ask(gateway, {**CHAT, "model": "a"})
    direct = _ask(gateway, {**CHAT, "model": "b"})

    assert (through.status_code, direct.status_code) == (200, 200), (through.text, direct.text)
    assert [r.target for r in proxy.relayed] == [
        f"http://upstream.test:{primary.port}/v1/chat/completions"]
    assert len(secondary.requests) == 1


def test_proxy_credentials_reach_the_proxy_and_nothing_else(
        start_gateway: Callable[..., GatewayProcess], primary: FakeUpstream,
        ca: trustme.CA, tmp_path: Path) -> None:
    primary.reset()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    secure = _tls_upstream(ca, "upstream.test")
    with ForwardProxy(credentials=("gateway", PASSWORD),
                      hosts={"upstream.test": "127.0.0.1"}) as guarded:
        try:
            doc = config({
                "plain": provider(_only_via_proxy(primary), {"a": "a"},
                                  proxy=guarded.url_with("gateway", PASSWORD)),
                "tunnel": provider(_only_via_proxy(secure, "https"), {"b": "b"},
                                   proxy=guarded.url_with("gateway", PASSWORD),
                                   tls={"ca_file": str(tmp_path / "ca.pem")}),
                "wrong": provider(_only_via_proxy(primary), {"c": "c"},
                                  proxy=guarded.url_with("gateway", "not-" + PASSWORD)),
            })
            gateway = start_gateway(doc)
            plain = _ask(gateway, {**CHAT, "model": "a"})
            tunnel = _ask(gateway, {**CHAT, "model": "b"})
            refused = _ask(gateway, {**CHAT, "model": "c"})
            status = httpx.get(f"{gateway.url}/status.json", timeout=10)
        finally:
            secure.stop()

    assert (plain.status_code, tunnel.status_code) == (200, 200), (plain.text, tunnel.text)
    assert {r.method for r in guarded.relayed} == {"POST", "CONNECT"}
    forwarded = b"".join(r.forwarded_head for r in guarded.relayed).lower()
    assert b"proxy-authorization" not in forwarded, "the proxy's credentials stop at the proxy"
    assert all("proxy-authorization" not in r.headers
               for r in [*primary.requests, *secure.requests])
    assert refused.status_code == 502
    attempt = refused.json()["error"]["attempts"][0]
    assert (attempt["reason"], attempt["status"]) == ("rejected", 407)
    for text in (refused.text, status.text, gateway.logs()):
        assert PASSWORD not in text
