"""Two gateways on one Redis, behind round robin: an old-revision (2025-11-25) MCP session
opened on one is served by both in turn, ended on either, and a cancellation that reaches the
other replica still stops the call upstream. No sticky sessions."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config, wait_until
from tests.redis_server import RedisServer

KEY = "client-key-mcp-0003"

WEB = httpx.Client(timeout=30.0)  # a first MCP request may load the SDK: seconds


class RoundRobin(httpx2.AsyncHTTPTransport):
    """What a load balancer without sticky sessions does: each request to the next replica."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self.ports = ports
        self.served: list[int] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[len(self.served) % len(self.ports)]
        self.served.append(port)
        request.url = request.url.copy_with(port=port)
        return await super().handle_async_request(request)


@pytest.fixture
def pair(tmp_path: Path, redis_server: RedisServer) -> Any:
    with FakeMcp("remote") as remote:
        doc = config({}, server={"api_keys": [KEY]},
                     state={"backend": "redis", "url": redis_server.url})
        doc["mcp_servers"] = {"remote": {"url": remote.url},
                              "local": {"command": [sys.executable,
                                                    "tests/mcp_stdio_server.py"]}}
        (tmp_path / "one").mkdir()
        (tmp_path / "two").mkdir()
        one = GatewayProcess(tmp_path / "one", doc).start(timeout=60)
        two = GatewayProcess(tmp_path / "two", doc).start(timeout=60)
        try:
            yield one, two, remote
        finally:
            one.stop()
            two.stop()


def test_one_old_revision_session_is_served_by_two_replicas_in_turn(pair: Any) -> None:
    one, two, _ = pair
    balancer = RoundRobin([one.port, two.port])

    async def story() -> list[str]:
        http = httpx2.AsyncClient(transport=balancer, timeout=30.0,
                                  headers={"Authorization": f"Bearer {KEY}"})
        said = []
        async with http, Client(streamable_http_client(f"{one.url}/mcp", http_client=http),
                                mode="legacy", cache=None) as client:
            for turn in range(4):
                result = await client.call_tool("remote_echo", {"text": f"turn {turn}"})
                said.append(result.content[0].text)  # type: ignore[union-attr]
            added = await client.call_tool("local_add", {"a": 1, "b": 1})
            said.append(str(added.structured_content))
        return said

    said = asyncio.run(story())

    assert said == [f"echo: turn {n}" for n in range(4)] + ["{'result': 2}"]
    assert set(balancer.served) == {one.port, two.port}


def test_a_session_ended_on_one_replica_is_404_on_the_other(pair: Any) -> None:
    one, two, _ = pair
    headers = {"authorization": f"Bearer {KEY}", "accept": "application/json, text/event-stream"}
    opened = WEB.post(f"{one.url}/mcp", headers=headers, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "curl", "version": "1"}}})
    session = {"mcp-session-id": opened.headers["mcp-session-id"],
               "mcp-protocol-version": "2025-11-25", **headers}
    listed = WEB.post(f"{two.url}/mcp", headers=session,
                        json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    ended = WEB.delete(f"{two.url}/mcp", headers=session)
    after = WEB.post(f"{one.url}/mcp", headers=session,
                       json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"})

    assert listed.status_code == 200 and listed.json()["result"]["tools"]
    assert ended.status_code == 200
    assert after.status_code == 404


def test_a_cancellation_that_reaches_the_other_replica_stops_the_call(pair: Any) -> None:
    one, two, remote = pair
    balancer = RoundRobin([one.port, two.port])

    async def story() -> None:
        http = httpx2.AsyncClient(transport=balancer, timeout=30.0,
                                  headers={"Authorization": f"Bearer {KEY}"})
        async with http, Client(streamable_http_client(f"{one.url}/mcp", http_client=http),
                                mode="legacy", cache=None) as client:
            call = asyncio.create_task(client.call_tool("remote_wait_until_cancelled", {}))
            await asyncio.to_thread(remote.started_waiting.wait, 10)
            call.cancel()
            await asyncio.to_thread(wait_until, remote.cancelled.is_set, 10.0)

    asyncio.run(story())
