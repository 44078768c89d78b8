"""MCP servers that fail: one stopped leaves the others' tools listed (the stopped one named in
`_meta`) and a call to it fails at once; a server that does not answer fails the call within its
timeout; a spawned server that dies is started again; a reload adds and removes servers live;
a gateway that stops stops the servers it spawned."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config, wait_until
from tests.mcp_clients import connected

KEY = "client-key-mcp-0002"
STDIO = [sys.executable, "tests/mcp_stdio_server.py"]

WEB = httpx.Client(timeout=30.0)  # a first MCP request may load the SDK: seconds


def doc_with(servers: dict[str, Any]) -> dict[str, Any]:
    doc = config({}, server={"api_keys": [KEY], "reload_interval": 0.2})
    doc["mcp_servers"] = servers
    return doc


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def tool_names(url: str) -> tuple[list[str], Any]:
    async with connected(f"{url}/mcp", KEY) as client:
        listed = await client.list_tools()
        return [tool.name for tool in listed.tools], listed.meta


def status(gateway: GatewayProcess) -> dict[str, Any]:
    found: dict[str, Any] = WEB.get(f"{gateway.url}/status.json",
                                      headers={"authorization": f"Bearer {KEY}"}).json()
    return {server["name"]: server for server in found["mcp_servers"]}


def test_a_stopped_server_leaves_the_others_listed_and_its_calls_fail_at_once(
        tmp_path: Path) -> None:
    remote = FakeMcp("remote").start()
    gateway = GatewayProcess(tmp_path, doc_with({
        "remote": {"url": remote.url, "timeout": 5},
        "local": {"command": STDIO}})).start(timeout=60)
    try:
        assert "remote_echo" in run(tool_names(gateway.url))[0]
        remote.stop()

        async def story() -> tuple[list[str], Any, MCPError]:
            async with connected(f"{gateway.url}/mcp", KEY) as client:
                with pytest.raises(MCPError) as failed:
                    await client.call_tool("remote_echo", {"text": "anyone?"})
                listed = await client.list_tools()
                return [tool.name for tool in listed.tools], listed.meta, failed.value

        names, meta, failed = run(story())
        shown = status(gateway)["remote"]
    finally:
        gateway.stop()
        remote.stop()

    assert names == ["local_add", "local_env", "local_pid", "local_crash"]
    assert meta == {"llms-gateway/unavailable": ["remote"]}
    assert "MCP server 'remote'" in str(failed)
    assert shown["state"] == "down"


def test_a_server_that_does_not_answer_fails_the_call_within_its_timeout(
        tmp_path: Path) -> None:
    with FakeMcp("slow") as slow:
        doc = doc_with({"slow": {"url": slow.url, "timeout": 1}})
        gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
        try:
            async def story() -> MCPError:
                async with connected(f"{gateway.url}/mcp", KEY) as client:
                    with pytest.raises(MCPError) as failed:
                        await client.call_tool("slow_wait_until_cancelled", {})
                    return failed.value

            failed = run(story())
            wait_until(slow.cancelled.is_set, 5.0, what="the upstream told to stop")
        finally:
            gateway.stop()

    assert "did not answer within 1s" in str(failed)


def test_a_call_past_its_server_s_timeout_is_a_request_timeout_counted_as_one(
        tmp_path: Path) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}
    with FakeMcp("slow") as slow:
        gateway = GatewayProcess(tmp_path, doc_with({"slow": {"url": slow.url, "timeout": 1}})
                                 ).start(timeout=60)
        try:
            answer = WEB.post(f"{gateway.url}/mcp", json={
                "jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "slow_wait_until_cancelled", "arguments": {},
                           "_meta": meta}}, headers={
                "authorization": f"Bearer {KEY}",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
                "mcp-name": "slow_wait_until_cancelled"})
            metrics = WEB.get(f"{gateway.url}/metrics",
                              headers={"authorization": f"Bearer {KEY}"}).text
        finally:
            gateway.stop()

    error = answer.json()["error"]
    assert error["code"] == -32001 and "did not answer within 1s" in error["message"]
    assert 'outcome="timeout"' in next(line for line in metrics.splitlines()
                                       if line.startswith("llms_mcp_tool_calls_total"))


def test_a_spawned_server_that_dies_is_started_again(tmp_path: Path) -> None:
    doc = doc_with({"local": {"command": STDIO}})
    gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
    try:
        async def crash() -> int:
            async with connected(f"{gateway.url}/mcp", KEY) as client:
                first = (await client.call_tool("local_pid", {})).structured_content
                with pytest.raises(MCPError):
                    await client.call_tool("local_crash", {})
                return int(first["result"])  # type: ignore[index]

        first_pid = run(crash())
        wait_until(lambda: status(gateway)["local"]["state"] == "ready"
                   and status(gateway)["local"]["restarts"] >= 1, 20.0,
                   what="the server started again")

        async def pid() -> int:
            async with connected(f"{gateway.url}/mcp", KEY) as client:
                found = (await client.call_tool("local_pid", {})).structured_content
                return int(found["result"])  # type: ignore[index]

        second_pid = run(pid())
    finally:
        gateway.stop()

    assert second_pid != first_pid


def test_a_reload_adds_and_removes_servers_and_a_stop_stops_what_it_spawned(
        tmp_path: Path) -> None:
    with FakeMcp("added") as added:
        doc = doc_with({"local": {"command": STDIO}})
        gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
        try:
            gateway.write_config(doc_with({"local": {"command": STDIO},
                                           "added": {"url": added.url}}))
            wait_until(lambda: "added_echo" in run(tool_names(gateway.url))[0], 20.0,
                       what="the added server's tools")
            gateway.write_config(doc_with({"local": {"command": STDIO}}))
            wait_until(lambda: "added_echo" not in run(tool_names(gateway.url))[0], 20.0,
                       what="the removed server's tools gone")

            async def pid() -> int:
                async with connected(f"{gateway.url}/mcp", KEY) as client:
                    found = (await client.call_tool("local_pid", {})).structured_content
                    return int(found["result"])  # type: ignore[index]

            spawned = run(pid())
        finally:
            gateway.stop()

    wait_until(lambda: not _alive(spawned), 10.0, what="the spawned server stopped")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone too: its parent, the gateway, has not reaped it only because it ended.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"
