"""Allow-lists of MCP tools per key and per team: a team's list bounds its keys', a denied tool
is absent from `tools/list`, and calling it gives exactly what calling a tool that does not
exist gives. Set through `/admin/keys`, `/admin/teams` and the CLI's `--mcp-tools`, audited."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config
from tests.mcp_clients import connected
from tests.test_cli import run as run_cli
from tests.test_teams import Admin

ADMIN_KEY = "admin-mcp-secret-01"
EVERY_TOOL = ["remote_echo", "remote_progress", "remote_wait_until_cancelled", "remote_big",
              "local_add", "local_env", "local_pid", "local_crash"]

WEB = httpx.Client(timeout=30.0)  # a first MCP request may load the SDK: seconds


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with FakeMcp("remote") as remote:
        doc = config({}, server={"admin_keys": [ADMIN_KEY]})
        doc["mcp_servers"] = {"remote": {"url": remote.url},
                              "local": {"command": [sys.executable, "tests/mcp_stdio_server.py"]}}
        gateway = GatewayProcess(tmp_path_factory.mktemp("allow"), doc).start(timeout=60)
        doc["server"]["port"] = gateway.port  # where the CLI finds it
        gateway.write_config(doc)
        yield gateway
        gateway.stop()


def names(gateway: GatewayProcess, key: str) -> list[str]:
    async def listed() -> list[str]:
        async with connected(f"{gateway.url}/mcp", key) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    return asyncio.run(listed())


def refusal(gateway: GatewayProcess, key: str, tool: str) -> tuple[int, str]:
    async def call() -> tuple[int, str]:
        async with connected(f"{gateway.url}/mcp", key) as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool(tool, {"text": "x"})
            return refused.value.error.code, refused.value.error.message

    return asyncio.run(call())


def raw_call(gateway: GatewayProcess, key: str, tool: str) -> httpx.Response:
    """A 2026-07-28 `tools/call` as it goes on the wire."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
    return WEB.post(f"{gateway.url}/mcp", json={
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": tool, "arguments": {}, "_meta": meta}}, headers={
        "authorization": f"Bearer {key}", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": tool})


def test_a_team_s_list_bounds_its_keys_and_a_denied_tool_is_an_unknown_one(
        gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    admin.team(name="docs", mcp_tools=["remote_*", "local_add"])
    made = run_cli("keys", "create", "--name", "writer", "--team", "docs",
                   "--mcp-tools", "remote_echo,local_*", "--config", str(gateway.config_path))
    assert made.returncode == 0, made.stderr
    key = re.findall(r"sk-llms-[\w-]+", made.stdout)[0]

    seen = names(gateway, key)
    denied, unknown = refusal(gateway, key, "remote_progress"), \
        refusal(gateway, key, "remote_nothing")
    raw_denied, raw_unknown = raw_call(gateway, key, "local_env"), \
        raw_call(gateway, key, "local_nothin")

    assert seen == ["remote_echo", "local_add"]
    assert denied == (unknown[0], unknown[1].replace("remote_nothing", "remote_progress"))
    assert raw_denied.status_code == raw_unknown.status_code == 400
    assert raw_denied.text.replace("local_env", "X") == raw_unknown.text.replace("local_nothin",
                                                                                  "X")


def test_an_empty_list_allows_none_and_no_list_every_tool(gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    none = admin.key(name="none", mcp_tools=[])["key"]
    every = admin.key(name="every")["key"]

    assert names(gateway, none) == []
    assert names(gateway, every) == EVERY_TOOL


def test_a_changed_list_holds_at_once_and_every_change_is_audited(
        gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    made = admin.key(name="changing", mcp_tools=["local_add"])
    before = names(gateway, made["key"])
    changed = admin.call("PATCH", f"/admin/keys/{made['id']}",
                         json={"mcp_tools": ["local_add", "local_env"]})
    after = names(gateway, made["key"])
    audit = admin.call("GET", "/admin/audit?limit=20").json()["data"]
    changes = [row["change"] for row in audit if row["target"] == made["id"]]

    assert before == ["local_add"]
    assert changed.json()["mcp_tools"] == ["local_add", "local_env"]
    assert after == ["local_add", "local_env"]
    assert {"mcp_tools": ["local_add", "local_env"]}.items() <= changes[0].items()


def test_a_list_that_is_not_a_list_of_names_is_a_400_naming_it(gateway: GatewayProcess
                                                                 ) -> None:
    answer: Any = Admin(gateway, ADMIN_KEY).call("POST", "/admin/keys",
                                                 json={"name": "bad", "mcp_tools": "docs_*"})

    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "mcp_tools"
