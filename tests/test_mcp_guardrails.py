"""Guardrails on MCP tool calls: a key's guardrails screen the arguments before the tool's
server sees them and the result before the client does. The official `mcp` SDK's client calls
a real MCP server (tests/fake_mcp.py, which records what its `echo` tool was given) through the
gateway, with virtual keys that carry the guardrails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config
from tests.mcp_clients import connected
from tests.test_teams import Admin

ADMIN_KEY = "admin-mcp-guard-01"
EMAIL = "alice@example.com"
SECRET = "sk-proj-Zq8d7Xc2Vb9Nm4Lk1Jh6Gf3Ds5Aa0Pp"
GUARDRAILS = {
    "pii": {"detect": ["email"], "action": "pseudonymize"},
    "no-secrets": {"detect": ["secrets"], "action": "block"},
    "no-secrets-out": {"detect": ["secrets"], "action": "block", "phases": ["output"]},
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, remote: FakeMcp
            ) -> Iterator[GatewayProcess]:
    doc = config({}, server={"admin_keys": [ADMIN_KEY]})
    doc["guardrails"] = GUARDRAILS
    doc["mcp_servers"] = {"remote": {"url": remote.url}}
    gateway = GatewayProcess(tmp_path_factory.mktemp("mcp-guard"), doc).start(timeout=60)
    yield gateway
    gateway.stop()


def key_with(gateway: GatewayProcess, *guardrails: str) -> str:
    return str(Admin(gateway, ADMIN_KEY).key(guardrails=list(guardrails))["key"])


def echo(gateway: GatewayProcess, key: str, text: str) -> Any:
    async def call() -> Any:
        async with connected(f"{gateway.url}/mcp", key) as client:
            return await client.call_tool("remote_echo", {"text": text})

    return asyncio.run(call())


def refused(gateway: GatewayProcess, key: str, text: str) -> MCPError:
    async def call() -> MCPError:
        async with connected(f"{gateway.url}/mcp", key) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("remote_echo", {"text": text})
            return caught.value

    return asyncio.run(call())


def test_the_tool_s_server_sees_a_placeholder_and_the_client_the_e_mail(
        gateway: GatewayProcess, remote: FakeMcp) -> None:
    key = key_with(gateway, "pii")

    result = echo(gateway, key, f"write to {EMAIL} today")

    assert remote.echoed[-1] == "write to [EMAIL_1] today"
    assert result.content[0].text == f"echo: write to {EMAIL} today"
    assert not result.is_error


def test_a_secret_in_the_arguments_is_blocked_before_the_tool_s_server_sees_it(
        gateway: GatewayProcess, remote: FakeMcp) -> None:
    key = key_with(gateway, "no-secrets")
    calls = len(remote.calls)

    error = refused(gateway, key, f"deploy with {SECRET}")

    assert remote.calls[calls:] == []
    assert "guardrail_violation" in error.error.message
    assert "no-secrets" in error.error.message and "SECRET" in error.error.message
    assert error.error.data == {"code": "guardrail_violation", "guardrail": "no-secrets",
                                "category": "SECRET"}
    assert SECRET not in str(error.error.model_dump())
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5,
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    assert 'llms_guardrail_actions_total{action="block",category="SECRET",' \
           'guardrail="no-secrets"} 1.0' in metrics


def test_a_secret_in_a_result_is_blocked_before_the_client_sees_it(
        gateway: GatewayProcess, remote: FakeMcp) -> None:
    key = key_with(gateway, "no-secrets-out")

    error = refused(gateway, key, f"deploy with {SECRET}")

    assert remote.echoed[-1] == f"deploy with {SECRET}"  # on the output side only
    assert error.error.data["guardrail"] == "no-secrets-out"
    assert "the answer holds SECRET" in error.error.message
    assert SECRET not in str(error.error.model_dump())


def test_a_key_without_guardrails_is_not_screened(gateway: GatewayProcess,
                                                   remote: FakeMcp) -> None:
    key = key_with(gateway)

    result = echo(gateway, key, f"{EMAIL} {SECRET}")

    assert remote.echoed[-1] == f"{EMAIL} {SECRET}"
    assert result.content[0].text == f"echo: {EMAIL} {SECRET}"
