"""Upstream keys never appear in a response, an error or a log line; each request logs once."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.gateway_process import GatewayProcess, config
from tests.upstream import FakeUpstream, status

KEY = "sk-live-topsecret-0123456789"


def test_upstream_key_never_leaks_and_each_request_logs_one_line(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    leaky, good = upstream_factory("leaky"), upstream_factory("good")
    # A provider that echoes the key it got in its error message, as some do.
    leaky.set_mode(status(400, message=f"Incorrect API key provided: {KEY}"),
                   status(503, message=f"bad {KEY}"))
    gateway = start_gateway(config({
        "leaky": {"type": "openai", "base_url": leaky.base_url, "api_key": "$LEAKY_KEY",
                  "models": {"m": "m"}},
        "good": {"type": "openai", "base_url": good.base_url, "api_key": "$LEAKY_KEY",
                 "models": {"other": "o"}},
    }), env={"LEAKY_KEY": KEY})
    url = f"{gateway.base_url}/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    relayed = httpx.post(url, json=body)
    failed = httpx.post(url, json=body)
    streamed = httpx.post(url, json={**body, "stream": True})
    answered = httpx.post(url, json={**body, "model": "other"})

    assert leaky.requests[0].headers["authorization"] == f"Bearer {KEY}"
    for response in (relayed, failed, streamed, answered):
        assert KEY not in response.text
        assert KEY not in str(response.headers)
    assert relayed.status_code == 400 and "Incorrect API key provided" in relayed.text
    lines = gateway.wait_for_log("request", count=4)
    assert KEY not in gateway.logs()
    assert len(lines) == 4
    last = lines[-1]
    for field in ("request_id", "model", "provider", "status", "attempts", "latency_ms",
                  "stream"):
        assert field in last
    assert (last["model"], last["provider"], last["status"]) == ("other", "good", 200)


def test_an_upstream_cookie_is_never_replayed_on_another_clients_request(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("edge")  # sets a __cf_bm cookie on every answer, as OpenAI's does
    # By name, not IP: aiohttp's default cookie jar ignores cookies from IP addresses.
    by_name = upstream.base_url.replace("127.0.0.1", "localhost")
    gateway = start_gateway(config({"edge": {"type": "openai", "base_url": by_name,
                                             "models": {"m": "m"}}}))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    first = httpx.post(f"{gateway.base_url}/chat/completions", json=body)
    second = httpx.post(f"{gateway.base_url}/chat/completions", json=body)

    assert first.status_code == second.status_code == 200
    assert [r.headers.get("cookie") for r in upstream.requests] == [None, None], \
        "the gateway's one upstream session must not carry one client's cookies into another's"
    assert "set-cookie" not in first.headers, "upstream cookies are not relayed to clients"


def test_a_kinds_own_credential_fields_are_redacted_like_api_keys() -> None:
    import json
    from pathlib import Path

    from gateway.config.loader import parse
    from gateway.config.snapshots import secrets

    doc = {"providers": {"cloud": {
        "type": "azure", "base_url": "https://res.openai.azure.com", "api_version": "2024-10-21",
        "azure_ad_token": "$TOKEN_FROM_ENV", "models": {"m": "deployment"},
        "entra": {"tenant_id": "t", "client_id": "c", "client_secret": "literal-secret-42"}}}}
    snapshot = parse(json.dumps(doc), Path("llms.json"), {"TOKEN_FROM_ENV": "eyJ-entra-token-9"})
    found = secrets(snapshot)
    assert "eyJ-entra-token-9" in found and "literal-secret-42" in found
    assert "deployment" not in found and "2024-10-21" not in found
