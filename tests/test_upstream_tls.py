"""TLS to upstreams: a private CA, a client certificate, and checks turned off on purpose.

Each test makes its own CA (`trustme`) and serves a fake upstream over TLS on loopback; the
gateway is the real process, configured with a provider's `"tls"` the way users write it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _ask(gateway: GatewayProcess, model: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", json={**CHAT, "model": model},
                      timeout=20)


@pytest.fixture
def ca(tmp_path: Path) -> trustme.CA:
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return authority


def _serve_tls(ca: trustme.CA, require_client_cert: bool = False) -> FakeUpstream:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
    return FakeUpstream(name="tls", tls=context).start()


@pytest.fixture
def secure(ca: trustme.CA) -> Iterator[FakeUpstream]:
    upstream = _serve_tls(ca)
    yield upstream
    upstream.stop()


def _attempt(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 502, answer.text
    attempt: dict[str, Any] = answer.json()["error"]["attempts"][0]
    return attempt


def test_an_upstream_signed_by_a_private_ca_is_trusted_only_with_its_ca_file(
        start_gateway: Callable[..., GatewayProcess], secure: FakeUpstream,
        tmp_path: Path) -> None:
    doc = config({
        "untrusting": provider(secure.base_url, {"a": "a"}),
        "trusting": provider(secure.base_url, {"b": "b"}, tls={"ca_file": "ca.pem"}),
    })
    gateway = start_gateway(doc)  # "ca.pem": relative to the config file's folder

    refused = _ask(gateway, "a")
    served = _ask(gateway, "b")

    attempt = _attempt(refused)
    assert attempt["reason"] == "unavailable"
    assert "TLS handshake failed: CERTIFICATE_VERIFY_FAILED" in attempt["message"]
    assert "certificate" in attempt["message"]
    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["message"]["content"] == "Hello from tls"
    assert len(secure.requests) == 1, "nothing was sent over the connection that failed"


def test_the_system_trust_store_is_used_without_a_tls_entry(
        start_gateway: Callable[..., GatewayProcess], secure: FakeUpstream,
        tmp_path: Path) -> None:
    # SSL_CERT_FILE replaces the system's store: what a CA bundle installed there does.
    gateway = start_gateway(config({"secure": provider(secure.base_url, {"m": "m"})}),
                            env={"SSL_CERT_FILE": str(tmp_path / "ca.pem")})

    answer = _ask(gateway, "m")

    assert answer.status_code == 200, answer.text


def test_an_upstream_that_requires_a_client_certificate_gets_the_configured_one(
        start_gateway: Callable[..., GatewayProcess], ca: trustme.CA, tmp_path: Path) -> None:
    client = ca.issue_cert("gateway@example.com")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    strict = _serve_tls(ca, require_client_cert=True)
    try:
        doc = config({
            "anonymous": provider(strict.base_url, {"a": "a"}, tls={"ca_file": "ca.pem"}),
            "identified": provider(strict.base_url, {"b": "b"}, tls={
                "ca_file": "ca.pem", "cert_file": str(tmp_path / "client.pem"),
                "key_file": str(tmp_path / "client.key")}),
        })
        gateway = start_gateway(doc)
        refused = _ask(gateway, "a")
        served = _ask(gateway, "b")
    finally:
        strict.stop()

    assert _attempt(refused)["reason"] == "unavailable"
    assert served.status_code == 200, served.text
    assert len(strict.requests) == 1


def test_verify_false_reaches_an_unknown_certificate_and_says_so_at_start(
        start_gateway: Callable[..., GatewayProcess], secure: FakeUpstream) -> None:
    doc = config({"lab": provider(secure.base_url, {"m": "m"}, tls={"verify": False})})
    gateway = start_gateway(doc)

    warnings = gateway.log_events("tls_verification_disabled")
    answer = _ask(gateway, "m")

    assert [w["provider"] for w in warnings] == ["lab"]
    assert warnings[0]["level"] == "warning"
    assert answer.status_code == 200, answer.text


def test_a_tls_file_that_is_missing_or_unusable_is_a_config_error_naming_the_field(
        start_gateway: Callable[..., GatewayProcess], secure: FakeUpstream,
        tmp_path: Path) -> None:
    (tmp_path / "not-a-cert.pem").write_text("not a certificate\n")
    missing = config({"p": provider(secure.base_url, {"m": "m"},
                                    tls={"ca_file": "nowhere.pem"})})
    unusable = config({"p": provider(secure.base_url, {"m": "m"},
                                     tls={"cert_file": "not-a-cert.pem"})})

    for doc, field in ((missing, "providers.p.tls.ca_file"),
                       (unusable, "providers.p: tls.cert_file")):
        with pytest.raises(RuntimeError) as failed:
            start_gateway(doc)
        assert field in str(failed.value)
