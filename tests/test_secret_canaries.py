"""No configured secret leaves the process, whatever an upstream echoes back.

Canary values stand in for every kind of secret a config holds (provider keys, configured header
values, URL and proxy credentials, the gateway's own keys). Upstreams of every kind echo the
request's headers back in errors, whole and streamed, opening and mid-way; the canaries must
appear in no answer, no in-band stream error, no log line, no status or admin page, no CLI line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.contract.redact import Redactor, mask_credentials, url_secrets
from tests.fake_anthropic import FakeAnthropic
from tests.fake_azure import FakeAzure
from tests.fake_bedrock import FakeBedrock
from tests.fake_gemini import FakeGemini
from tests.fake_vertex import EMAIL, FakeVertex, service_account
from tests.gateway_process import ROOT, GatewayProcess, config, free_port
from tests.upstream import FakeUpstream, Mode, echo_headers

CANARIES = {
    "CANARY_API_KEY": "canary-apikey-7f3a9c",  # not key-shaped: only the config knows it
    "CANARY_ORG": "canary-orgtoken-51be",
    "CANARY_URL_PASS": "canary-urlpass-88c1",
    "CANARY_PROXY_PASS": "canary-proxypass-22d0",
    "CANARY_GATEWAY": "canary-gatewaykey-19e4",
    "CANARY_ADMIN": "canary-adminkey-6a0f",
    "CANARY_AD_TOKEN": "canary-adtoken-3e7b",  # an Entra ID token, known only to its kind
    # The `bedrock` kind's, from the standard AWS chain: the key id goes out in every signature,
    # the session token in a header, the secret only into the signature.
    "AWS_ACCESS_KEY_ID": "AKIACANARY0000000001",
    "AWS_SECRET_ACCESS_KEY": "canary-awssecret-3c9d",
    "AWS_SESSION_TOKEN": "canary-awstoken-77ab",
}
GATEWAY_KEY, ADMIN_KEY = CANARIES["CANARY_GATEWAY"], CANARIES["CANARY_ADMIN"]
KINDS = ("openai", "anthropic", "google", "ollama", "azure", "bedrock", "vertex")
ALIASES = {**{kind: f"{kind}-m" for kind in KINDS}, "urlcreds": "urlcreds-m",
           "azuretoken": "azuretoken-m"}
UPSTREAM_OF = {"urlcreds": "openai", "azuretoken": "azure"}


def _entry(kind: str, base_url: str, **extra: Any) -> dict[str, Any]:
    if kind == "azure":
        extra = {"api_version": "2024-10-21", **extra}
    if kind == "bedrock":  # AWS's credentials come from the environment, not an api_key
        return {"type": kind, "region": "us-east-1", "base_url": base_url.removesuffix("/v1"),
                "headers": {"X-Org-Token": "$CANARY_ORG"}, "models": {f"{kind}-m": "m"}}
    return {"type": kind, "base_url": base_url, "api_key": "$CANARY_API_KEY",
            "headers": {"X-Org-Token": "$CANARY_ORG"}, "models": {f"{kind}-m": "m"}, **extra}


@pytest.fixture
def upstreams() -> Iterator[dict[str, FakeUpstream]]:
    made = {"openai": FakeUpstream(name="oa"), "anthropic": FakeAnthropic(name="an"),
            "google": FakeGemini(name="gm"), "ollama": FakeUpstream(name="ol"),
            "azure": FakeAzure(name="az", key=CANARIES["CANARY_API_KEY"], deployments=("m",),
                               tokens={CANARIES["CANARY_AD_TOKEN"]}),
            "bedrock": FakeBedrock(name="br", keys={CANARIES["AWS_ACCESS_KEY_ID"]:
                                                   CANARIES["AWS_SECRET_ACCESS_KEY"]}),
            "vertex": FakeVertex(name="vx")}
    for upstream in made.values():
        upstream.start()
    yield made
    for upstream in made.values():
        upstream.stop()


@pytest.fixture
def canary_gateway(start_gateway: Callable[..., GatewayProcess],
                   upstreams: dict[str, FakeUpstream], tmp_path: Path) -> GatewayProcess:
    providers = {kind: _entry(kind, upstream.base_url) for kind, upstream in upstreams.items()}
    # Vertex's credentials are a key file and the access tokens minted from it.
    vertex = upstreams["vertex"]
    assert isinstance(vertex, FakeVertex)
    key_file = tmp_path / "vertex-account.json"
    vertex.trust(EMAIL, service_account(key_file, vertex.token_uri, vertex.project))
    providers["vertex"] |= {"project": vertex.project, "credentials": str(key_file)}
    providers["openai"]["passthrough"] = ["/v1/vector_stores/*"]
    # Credentials in the URL instead of a key: the client sends them as Basic auth.
    with_credentials = upstreams["openai"].base_url.replace(
        "http://", f"http://canaryuser:{CANARIES['CANARY_URL_PASS']}@")
    providers["azuretoken"] = {"type": "azure", "base_url": upstreams["azure"].base_url,
                               "api_version": "2024-10-21", "azure_ad_token": "$CANARY_AD_TOKEN",
                               "models": {"azuretoken-m": "m"}}
    providers["urlcreds"] = {"type": "openai", "base_url": with_credentials,
                             "models": {"urlcreds-m": "m"}}
    # A proxy with credentials that refuses connections: its URL may reach an error message.
    proxied = f"http://proxyuser:{CANARIES['CANARY_PROXY_PASS']}@127.0.0.1:{free_port()}"
    providers["proxied"] = {**_entry("openai", upstreams["openai"].base_url, proxy=proxied),
                            "models": {"proxied-m": "m"}}
    doc = config(providers, server={"api_keys": ["$CANARY_GATEWAY"],
                                    "admin_keys": ["$CANARY_ADMIN"]})
    return start_gateway(doc, env=CANARIES)


def _post(gateway: GatewayProcess, model: str, stream: bool) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    return f"{response.status_code} {response.headers} {response.text}"


def _leaks(text: str) -> list[str]:
    """The canaries `text` carries, the URL's credentials in their Basic form among them."""
    basic = url_secrets(f"http://canaryuser:{CANARIES['CANARY_URL_PASS']}@h")[-1]
    return [name for name, value in {**CANARIES, "basic": basic}.items() if value in text]


SCENARIOS: list[tuple[str, Mode, bool]] = [
    ("a 400 echoing the headers, relayed to the client", echo_headers(400), False),
    ("a 500 echoing the headers, in attempts", echo_headers(500), False),
    ("a stream opening with an echoing error event", echo_headers(200, at="open"), True),
    ("a stream failing mid-way with an echoing error event", echo_headers(200, at="mid"), True),
]


def test_no_canary_leaves_through_answers_streams_logs_status_or_the_cli(
        canary_gateway: GatewayProcess, upstreams: dict[str, FakeUpstream],
        tmp_path: Path) -> None:
    seen: list[str] = []
    for name, alias in ALIASES.items():
        for story, mode, stream in SCENARIOS:
            if name in ("google", "vertex") and mode.message in ("open", "mid"):
                continue  # Gemini's fake has no error events; its error bodies are covered
            upstreams[UPSTREAM_OF.get(name, name)].set_mode(mode)
            answer = _post(canary_gateway, alias, stream)
            assert not _leaks(answer), f"{name}: {story}: {answer}"
            seen.append(answer)
    seen.append(_post(canary_gateway, "proxied-m", False))
    echoed = httpx.get(f"{canary_gateway.url}/passthrough/openai/v1/vector_stores/echo",
                       headers={"Authorization": f"Bearer {GATEWAY_KEY}"})
    assert "x-org-token=***" in echoed.text.lower(), "the passthrough's echo, redacted"
    seen.append(f"{echoed.status_code} {echoed.headers} {echoed.text}")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for path in ("/status.json", "/ready", "/admin/providers", "/metrics"):
        seen.append(httpx.get(f"{canary_gateway.url}{path}", headers=admin).text)
    cli = [subprocess.run([sys.executable, "-m", "gateway", command, "--config",
                           str(canary_gateway.config_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **CANARIES})
           for command in ("ls", "check")]
    canary_gateway.wait_for_log("request", count=len(seen) - 4)  # every relayed request

    # the upstreams got the secrets
    for kind in ("openai", "anthropic", "ollama", "azure", "bedrock"):
        assert any(r.headers.get("x-org-token") == CANARIES["CANARY_ORG"]
                   for r in upstreams[kind].requests)
    assert any(r.headers.get("x-amz-security-token") == CANARIES["AWS_SESSION_TOKEN"]
               for r in upstreams["bedrock"].requests)
    assert not upstreams["bedrock"].refusals, "every request to the fake AWS was signed right"
    assert "debug: " in seen[0] and "***" in seen[0]  # the echo reached the client, redacted
    assert "x-org-token=***" in seen[0].lower()
    assert "debug: " in cli[1].stdout  # check quoted the upstream's echo, redacted
    vertex = upstreams["vertex"]
    assert isinstance(vertex, FakeVertex) and vertex.tokens_minted()
    key = json.loads((tmp_path / "vertex-account.json").read_text())["private_key"]
    minted = [*vertex.tokens_minted(), *key.splitlines()[1:-1]]  # tokens, the key's lines
    for text in [*seen, canary_gateway.logs(), *(r.stdout + r.stderr for r in cli)]:
        assert not _leaks(text), text[:2000]
        assert not [secret for secret in minted if secret in text], text[:2000]


@pytest.mark.parametrize(("text", "masked"), [
    ("Authorization=Bearer sk-abcdef0123456789", "Authorization=Bearer ***"),
    ("x-api-key: abcdef0123456789xyz", "x-api-key: ***"),
    ("url https://api.example/v1?key=AIzaSyAbc123&x=1", "url https://api.example/v1?key=***&x=1"),
    ("proxy http://bob:hunter22@proxy:3128 down", "proxy http://***@proxy:3128 down"),
    ("authorization: Basic Ym9iOmh1bnRlcjIy", "authorization: Basic ***"),
    ("token sk-proj-0123456789abcdef", "token ***"),
    ("nothing secret in model gpt-4o-mini", "nothing secret in model gpt-4o-mini"),
])
def test_key_shaped_tokens_in_upstream_text_are_masked(text: str, masked: str) -> None:
    assert mask_credentials(text) == masked


def test_the_redactor_removes_configured_secrets_longest_first_and_ignores_short_values() -> None:
    redactor = Redactor.of(["abcdef1234", "abcdef1234-longer", "on", ""])

    assert redactor.text("a abcdef1234-longer b abcdef1234 c on") == "a *** b *** c on"
    assert redactor.encoded(b'{"m":"abcdef1234"}') == b'{"m":"***"}'
    assert Redactor.of([]).text("abcdef1234") == "abcdef1234"
