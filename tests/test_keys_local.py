"""Keys never surprise a local user: once a virtual key is made, a request without one is told
why it is refused, and the commands that read the running gateway take the key too."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.gateway_process import ROOT, GatewayProcess
from tests.test_teams import MESSAGES, Admin, priced
from tests.upstream import FakeUpstream

ADMIN = "admin-secret-000001"


@pytest.fixture
def keyed(start_gateway: Callable[..., GatewayProcess],
          upstream_factory: Callable[[str], FakeUpstream]) -> tuple[GatewayProcess, str]:
    """A local gateway whose llms.json sets no key, after its first virtual key was made."""
    doc = priced(upstream_factory("local"), "m")
    gateway = start_gateway(doc)
    doc["server"]["port"] = gateway.port  # the commands find the gateway where its config says
    gateway.write_config(doc)
    return gateway, Admin(gateway).key(name="laptop")["key"]


def command(gateway: GatewayProcess, *args: str, key: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(gateway.config_path.parent)}
    if key is not None:
        env["LLMS_GATEWAY_KEY"] = key
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env=env)


def test_a_readme_client_is_told_why_a_key_is_now_required(
        keyed: tuple[GatewayProcess, str]) -> None:
    gateway, _ = keyed
    client = openai.OpenAI(base_url=gateway.base_url, api_key="not-needed", max_retries=0)

    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="m", messages=MESSAGES)

    said = refused.value.message
    assert "requires a key since a virtual key was made" in said
    assert "docs/teams.md" in said


def test_ls_and_usage_read_the_running_gateway_with_its_key_and_say_when_they_lack_it(
        keyed: tuple[GatewayProcess, str]) -> None:
    gateway, key = keyed

    blind = command(gateway, "ls", "--config", str(gateway.config_path))
    seeing = command(gateway, "ls", "--config", str(gateway.config_path), "--key", key)
    refused = command(gateway, "usage", "--url", gateway.base_url)
    counted = command(gateway, "usage", "--url", gateway.base_url, key=key)

    assert "answered 401" in blind.stdout and "--key" in blind.stdout
    assert seeing.returncode == 0 and "answered 401" not in seeing.stdout
    assert "this is the config's view" not in seeing.stdout
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr and "--key" in refused.stderr
    assert counted.returncode == 0 and "total cost" in counted.stdout


def test_reopen_is_the_one_audited_way_back_to_a_gateway_without_keys(
        keyed: tuple[GatewayProcess, str]) -> None:
    gateway, _ = keyed
    ask = {"model": "m", "messages": MESSAGES, "max_tokens": 8}

    reopened = command(gateway, "keys", "reopen", "--config", str(gateway.config_path))

    assert reopened.returncode == 0, reopened.stderr
    assert "Revoked 1 key" in reopened.stdout
    assert httpx.post(f"{gateway.base_url}/chat/completions", json=ask,
                      timeout=10).status_code == 200
    assert Admin(gateway).call("GET", "/admin/keys").json()["data"][0]["revoked_at"]
    audit = Admin(gateway).call("GET", "/admin/audit").json()["data"]
    assert audit[0]["action"] == "gateway_reopened" and audit[0]["change"] == {"revoked": 1}
    Admin(gateway).key(name="again")  # a new key closes it again
    assert httpx.post(f"{gateway.base_url}/chat/completions", json=ask,
                      timeout=10).status_code == 401


def test_a_gateway_listening_beyond_this_machine_is_never_reopened(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    doc = priced(upstream_factory("wide"), "m", server={"admin_keys": [ADMIN]})
    gateway = start_gateway(doc, extra_args=("--host", "0.0.0.0", "--allow-unauthenticated"))
    Admin(gateway, ADMIN).key(name="laptop")

    refused = command(gateway, "keys", "reopen", "--url", gateway.url, "--admin-key", ADMIN)

    assert refused.returncode == 1
    assert "listens on 0.0.0.0" in refused.stderr
    assert httpx.post(f"{gateway.base_url}/chat/completions", timeout=10, json={
        "model": "m", "messages": MESSAGES}).status_code == 401
