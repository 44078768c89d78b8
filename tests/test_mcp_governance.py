"""What every MCP tool call through the gateway pays and leaves behind: its key's per-minute
limit (429 with Retry-After), its price charged to budgets like tokens, an audit row with its
arguments redacted, metrics, an `execute_tool` span under the request's, and each server's
state on `/status.json` and in `llms-gateway ls`. An upstream behind OAuth client credentials
gets the gateway's own token, traded again when it is refused."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.fake_mcp import CLIENT_ID, CLIENT_SECRET, FakeMcp
from tests.gateway_process import GatewayProcess, config, wait_until
from tests.mcp_clients import connected
from tests.otlp_receiver import SERVER, OtlpReceiver
from tests.test_cli import run as run_cli
from tests.test_teams import Admin

ADMIN_KEY = "admin-mcp-secret-02"
UPSTREAM_SECRET = "upstream-secret-91b2c4d"
WEB = httpx.Client(timeout=30.0)  # a first MCP request may load the SDK: seconds


@pytest.fixture(scope="module")
def traces() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, traces: OtlpReceiver
            ) -> Iterator[GatewayProcess]:
    with FakeMcp("remote") as remote:
        doc = config({}, server={"admin_keys": [ADMIN_KEY]},
                     telemetry={"otlp_endpoint": traces.endpoint})
        doc["mcp"] = {"tool_calls_per_minute": 1000}
        doc["mcp_servers"] = {
            "remote": {"url": remote.url, "price": 0.25, "tool_prices": {"big": 0.0},
                       "headers": {"Authorization": f"Bearer {UPSTREAM_SECRET}"}},
            "local": {"command": [sys.executable, "tests/mcp_stdio_server.py"]}}
        gateway = GatewayProcess(tmp_path_factory.mktemp("governed"), doc,
                                 env={"OTEL_BSP_SCHEDULE_DELAY": "50"}).start(timeout=60)
        doc["server"]["port"] = gateway.port  # where `ls` finds it
        gateway.write_config(doc)
        yield gateway
        gateway.stop()


def call(gateway: GatewayProcess, key: str, tool: str, arguments: dict[str, Any]) -> Any:
    """The tool's result, or the MCPError the SDK raised (caught inside the client's context,
    which would otherwise wrap it in an exception group)."""
    async def story() -> Any:
        async with connected(f"{gateway.url}/mcp", key) as client:
            try:
                return await client.call_tool(tool, arguments)
            except MCPError as exc:
                return exc

    return asyncio.run(story())


def test_a_priced_call_is_charged_to_the_key_s_budget_until_it_is_spent(
        gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    key = admin.key(name="priced", budget={"usd": 0.5, "period": "total"})

    for _ in range(2):
        assert not call(gateway, key["key"], "remote_echo", {"text": "paid"}).is_error
    free = call(gateway, key["key"], "remote_big", {"size": 10})
    refused = call(gateway, key["key"], "remote_echo", {"text": "one too many"})
    spent = admin.spend("key")[key["id"]]

    assert not free.is_error  # its own price: nothing
    assert isinstance(refused, MCPError) and "Budget exceeded" in str(refused)
    assert spent["cost"] == pytest.approx(0.5)


def test_every_call_is_audited_with_its_arguments_redacted(gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    key = admin.key(name="audited")
    call(gateway, key["key"], "remote_echo",
         {"text": f"mine is {UPSTREAM_SECRET} and sk-abcdefghijklmnop1234"})

    def audited() -> dict[str, Any] | None:
        rows = admin.call("GET", "/admin/audit?limit=50").json()["data"]
        return next((row for row in rows if row["action"] == "mcp_tool_call"
                     and row["actor"] == key["id"]), None)

    row = wait_until(audited, 10.0, what="the call's audit row")

    assert row["target"] == "remote/echo"
    assert row["change"]["outcome"] == "completed" and row["change"]["latency_ms"] > 0
    assert UPSTREAM_SECRET not in str(row) and "sk-abcdefghijklmnop1234" not in str(row)
    assert "mine is ***" in row["change"]["arguments"]


def test_calls_are_counted_timed_and_traced_under_the_request_s_span(
        gateway: GatewayProcess, traces: OtlpReceiver) -> None:
    key = Admin(gateway, ADMIN_KEY).key(name="counted")["key"]
    call(gateway, key, "local_add", {"a": 1, "b": 2})
    metrics = WEB.get(f"{gateway.url}/metrics",
                      headers={"authorization": f"Bearer {ADMIN_KEY}"}).text

    span = wait_until(lambda: next((s for s in traces.spans
                                    if s.name == "execute_tool local_add"), None), 10.0)
    parent = wait_until(lambda: next((s for s in traces.spans
                                      if s.span_id == span.parent_id), None), 10.0)

    assert 'llms_mcp_tool_calls_total{outcome="completed",server="local",tool="add"} ' \
        in metrics.replace('server="local",tool="add",outcome="completed"',
                           'outcome="completed",server="local",tool="add"')
    assert 'llms_mcp_tool_call_duration_seconds_count{server="local"}' in metrics
    assert span.attributes["gen_ai.operation.name"] == "execute_tool"
    assert span.attributes["gen_ai.tool.name"] == "local_add"
    assert parent.kind == SERVER and parent.trace_id == span.trace_id


def test_status_and_ls_show_each_server_s_state_and_tool_count(gateway: GatewayProcess
                                                                ) -> None:
    shown = WEB.get(f"{gateway.url}/status.json",
                    headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()["mcp_servers"]
    listed = run_cli("ls", "--config", str(gateway.config_path),
                     env={"LLMS_ADMIN_KEY": ADMIN_KEY})

    assert [(s["name"], s["state"], s["tools"]) for s in shown] == [
        ("remote", "ready", 4), ("local", "ready", 4)]
    assert "remote         http   ready, 4 tools" in listed.stdout
    assert "local          stdio  ready, 4 tools" in listed.stdout


def test_a_key_past_its_tool_calls_per_minute_gets_429_with_retry_after(
        tmp_path: Path) -> None:
    doc = config({}, server={"api_keys": ["client-key-mcp-0004"]})
    doc["mcp"] = {"tool_calls_per_minute": 2}
    doc["mcp_servers"] = {"local": {"command": [sys.executable, "tests/mcp_stdio_server.py"]}}
    gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
    try:
        answers = [WEB.post(f"{gateway.url}/mcp", json={
            "jsonrpc": "2.0", "id": n, "method": "tools/call",
            "params": {"name": "local_add", "arguments": {"a": n, "b": 0}, "_meta": meta}},
            headers={"authorization": "Bearer client-key-mcp-0004",
                     "accept": "application/json", "mcp-protocol-version": "2026-07-28",
                     "mcp-method": "tools/call", "mcp-name": "local_add"})
            for n in range(6)]  # a minute's window may turn over once among them
    finally:
        gateway.stop()

    refused = [a for a in answers if a.status_code == 429]
    assert refused and all(a.status_code in (200, 429) for a in answers)
    assert 1 <= int(refused[0].headers["retry-after"]) <= 60
    assert refused[0].json()["error"]["message"].startswith("This key made its 2 MCP tool")


def test_an_upstream_behind_oauth_gets_the_gateway_s_token_traded_again_when_refused(
        tmp_path: Path) -> None:
    with FakeMcp("secured", oauth=True) as secured:
        doc = config({}, server={"api_keys": ["client-key-mcp-0005"]})
        doc["mcp_servers"] = {"secured": {"url": secured.url, "oauth": {
            "token_url": secured.token_url, "client_id": CLIENT_ID,
            "client_secret": "$MCP_CLIENT_SECRET"}}}
        gateway = GatewayProcess(tmp_path, doc, env={"MCP_CLIENT_SECRET": CLIENT_SECRET}
                                 ).start(timeout=60)
        try:
            first = call(gateway, "client-key-mcp-0005", "secured_echo", {"text": "1"})
            secured.revoke()
            second = call(gateway, "client-key-mcp-0005", "secured_echo", {"text": "2"})
        finally:
            gateway.stop()

    assert first.content[0].text == "echo: 1" and second.content[0].text == "echo: 2"
    assert secured.tokens_issued >= 2
    assert not any("client-key-mcp-0005" in v for h in secured.headers_seen for v in h.values())
