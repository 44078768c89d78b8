"""A tool call to a streamable-HTTP server is posted by the gateway itself, through the transport
its providers use, once the SDK's client has connected: whether the server answers as SSE or as
one JSON body, speaks 2026-07-28 or only 2025-11-25 (with a session), or refuses the gateway's
token once. The official SDK's client calls the tools through `/mcp`; the fake servers
(tests/fake_mcp.py) record every POST, so each story can see who posted what.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_mcp import CLIENT_ID, CLIENT_SECRET, FakeMcp
from tests.gateway_process import GatewayProcess, config, wait_until
from tests.mcp_clients import connected

KEY = "client-key-mcp-0031"


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, FakeMcp]]:
    with FakeMcp("sse") as sse, FakeMcp("json", json_response=True) as json_answers, \
            FakeMcp("old", legacy=True) as old:
        yield {"sse": sse, "json": json_answers, "old": old}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, FakeMcp]
            ) -> Iterator[GatewayProcess]:
    doc = config({}, server={"api_keys": [KEY]})
    doc["mcp_servers"] = {
        "sse": {"url": servers["sse"].url},
        "json": {"url": servers["json"].url, "max_result_bytes": 2048},
        "old": {"url": servers["old"].url}}
    gateway = GatewayProcess(tmp_path_factory.mktemp("direct"), doc).start(timeout=60)
    yield gateway
    gateway.stop()


def posted_by_the_gateway(headers: dict[str, str]) -> bool:
    """Sent through the gateway's aiohttp transport, not the SDK's httpx2 client."""
    return "aiohttp" in headers.get("user-agent", "")


def test_an_sse_answer_is_read_and_its_progress_relayed(
        gateway: GatewayProcess, servers: dict[str, FakeMcp]) -> None:
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        heard.append((done, total, message))

    async def story() -> tuple[Any, Any]:
        async with connected(f"{gateway.url}/mcp", KEY) as client:
            return (await client.call_tool("sse_echo", {"text": "streamed"}),
                    await client.call_tool("sse_progress", {"steps": 2},
                                           progress_callback=progress))

    echoed, counted = run(story())
    calls = servers["sse"].calls_posted()

    assert echoed.content[0].text == "echo: streamed"
    assert counted.content[0].text == "counted to 2"
    assert heard == [(1, 2, "step 1"), (2, 2, "step 2")]
    assert len(calls) == 2 and all(posted_by_the_gateway(headers) for headers in calls)
    assert all(headers["mcp-protocol-version"] == "2026-07-28"
               and headers["mcp-method"] == "tools/call" for headers in calls)


def test_a_json_answer_is_read_and_its_bound_kept(gateway: GatewayProcess,
                                                 servers: dict[str, FakeMcp]) -> None:
    async def story() -> tuple[Any, Any, Any]:
        async with connected(f"{gateway.url}/mcp", KEY, "legacy") as client:
            return (await client.call_tool("json_echo", {"text": "whole"}),
                    await client.call_tool("json_big", {"size": 500}),
                    await client.call_tool("json_big", {"size": 5000}))

    echoed, small, large = run(story())

    assert echoed.content[0].text == "echo: whole" and not echoed.is_error
    assert small.content[0].text == "x" * 500
    assert large.is_error and "over the 2048" in large.content[0].text
    assert all(posted_by_the_gateway(headers) for headers in servers["json"].calls_posted())


def test_an_old_server_gets_its_session_id_and_hears_a_cancellation_at_once(
        gateway: GatewayProcess, servers: dict[str, FakeMcp]) -> None:
    old = servers["old"]
    old.cancelled.clear()
    old.started_waiting.clear()

    async def story() -> Any:
        async with connected(f"{gateway.url}/mcp", KEY) as client:
            echoed = await client.call_tool("old_echo", {"text": "session"})
            call = asyncio.create_task(client.call_tool("old_wait_until_cancelled", {}))
            await asyncio.to_thread(old.started_waiting.wait, 10)
            call.cancel()
            await asyncio.to_thread(wait_until, old.cancelled.is_set, 5.0)
            return echoed

    echoed = run(story())
    listed = [headers for method, headers in old.posted if method == "tools/list"]
    calls = old.calls_posted()

    assert echoed.content[0].text == "echo: session"
    assert listed and calls and all(posted_by_the_gateway(headers) for headers in calls)
    assert {headers["mcp-session-id"] for headers in calls} \
        == {listed[-1]["mcp-session-id"]}
    assert all(headers["mcp-protocol-version"] == "2025-11-25" for headers in calls)
    assert "notifications/cancelled" in [method for method, _ in old.posted]


def test_a_call_refused_once_with_401_gets_the_token_traded_again_and_posted_again(
        tmp_path: Path) -> None:
    with FakeMcp("secured", oauth=True) as secured:
        doc = config({}, server={"api_keys": [KEY]})
        doc["mcp_servers"] = {"secured": {"url": secured.url, "oauth": {
            "token_url": secured.token_url, "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET}}}
        gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
        try:
            async def story() -> tuple[Any, int, Any]:
                async with connected(f"{gateway.url}/mcp", KEY) as client:
                    first = await client.call_tool("secured_echo", {"text": "1"})
                    issued = secured.tokens_issued
                    secured.refuse_next_call()
                    return first, issued, await client.call_tool("secured_echo", {"text": "2"})

            first, issued, second = run(story())
        finally:
            gateway.stop()

    tokens = [headers["authorization"] for headers in secured.calls_posted()]

    assert first.content[0].text == "echo: 1" and second.content[0].text == "echo: 2"
    assert secured.tokens_issued == issued + 1
    assert len(tokens) == 3 and tokens[0] == tokens[1] != tokens[2]
    assert secured.echoed == ["1", "2"]
