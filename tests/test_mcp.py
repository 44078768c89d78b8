"""The MCP gateway: one endpoint for every tool server, behind the gateway's keys.

The official `mcp` SDK's client, on both protocol revisions, lists and calls the tools of two
upstreams through `/mcp`: a streamable-HTTP server written with the SDK's server side
(tests/fake_mcp.py) and a stdio server the gateway spawns (tests/mcp_stdio_server.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError

from gateway.mcp.names import CLIENT_PREFIX, MAX_NAME, namespaced, valid
from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config, wait_until
from tests.mcp_clients import EXPECTED, REVISIONS, connected

KEY = "client-key-mcp-0001"
UPSTREAM_SECRET = "upstream-secret-7f3a9c"
CANARY = "LLMS_TEST_CANARY"
STDIO = [sys.executable, "tests/mcp_stdio_server.py"]

WEB = httpx.Client(timeout=30.0)  # a first MCP request may load the SDK: seconds


def mcp_config(remote: FakeMcp, **servers: Any) -> dict[str, Any]:
    doc = config({}, server={"api_keys": [KEY]})
    doc["mcp_servers"] = {
        "remote": {"url": remote.url, "headers": {"Authorization": f"Bearer {UPSTREAM_SECRET}"}},
        "local": {"command": STDIO, "env": {"GREETING": "hello"}},
        **servers}
    return doc


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, remote: FakeMcp
            ) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(tmp_path_factory.mktemp("mcp"), mcp_config(remote),
                             env={CANARY: "must-not-reach-spawned-servers"})
    gateway.start(timeout=60)
    yield gateway
    gateway.stop()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.mark.parametrize("mode", REVISIONS)
def test_the_sdk_client_lists_and_calls_both_upstreams_through_one_endpoint(
        gateway: GatewayProcess, mode: str) -> None:
    async def story() -> None:
        async with connected(f"{gateway.url}/mcp", KEY, mode) as client:
            assert client.protocol_version == EXPECTED[mode]
            names = [tool.name for tool in (await client.list_tools()).tools]
            echoed = await client.call_tool("remote_echo", {"text": "hi"})
            added = await client.call_tool("local_add", {"a": 2, "b": 40})

            assert names == ["remote_echo", "remote_progress", "remote_wait_until_cancelled",
                             "remote_big", "local_add", "local_env", "local_pid", "local_crash"]
            assert echoed.content[0].text == "echo: hi"  # type: ignore[union-attr]
            assert added.structured_content == {"result": 42}

    run(story())


@pytest.mark.parametrize("mode", REVISIONS)
def test_progress_is_relayed_as_it_comes(gateway: GatewayProcess, mode: str) -> None:
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        heard.append((done, total, message))

    async def story() -> Any:
        async with connected(f"{gateway.url}/mcp", KEY, mode) as client:
            return await client.call_tool("remote_progress", {"steps": 3},
                                          progress_callback=progress)

    result = run(story())

    assert heard == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert result.content[0].text == "counted to 3"


@pytest.mark.parametrize("mode", REVISIONS)
def test_a_cancelled_call_is_cancelled_upstream_at_once(gateway: GatewayProcess,
                                                        remote: FakeMcp, mode: str) -> None:
    remote.cancelled.clear()
    remote.started_waiting.clear()

    async def story() -> None:
        async with connected(f"{gateway.url}/mcp", KEY, mode) as client:
            call = asyncio.create_task(client.call_tool("remote_wait_until_cancelled", {}))
            await asyncio.to_thread(remote.started_waiting.wait, 10)
            call.cancel()
            # Still connected: the upstream hears the cancellation, not the client's leaving.
            await asyncio.to_thread(wait_until, remote.cancelled.is_set, 5.0)

    run(story())


def test_the_upstream_sees_its_configured_secret_never_the_client_s_key(
        gateway: GatewayProcess, remote: FakeMcp) -> None:
    async def story() -> None:
        async with connected(f"{gateway.url}/mcp", KEY) as client:
            await client.call_tool("remote_echo", {"text": "who"})

    run(story())

    seen = [headers for headers in remote.headers_seen]
    assert seen and all(h.get("authorization") == f"Bearer {UPSTREAM_SECRET}" for h in seen)
    assert not any(KEY in value for h in seen for value in h.values())


def test_a_spawned_server_gets_only_what_its_env_names_plus_path_and_home(
        gateway: GatewayProcess) -> None:
    async def story() -> str:
        async with connected(f"{gateway.url}/mcp", KEY) as client:
            result = await client.call_tool("local_env", {})
            return str(result.content[0].text)  # type: ignore[union-attr]

    names = set(run(story()).split(","))

    # LC_CTYPE is Python's own (PEP 538 sets it in a C locale), not inherited.
    assert names - {"LC_CTYPE"} == {"GREETING", "PATH", "HOME"}


def test_without_a_key_every_mcp_path_answers_401_naming_its_resource_metadata(
        gateway: GatewayProcess) -> None:
    for path in ("/mcp", "/mcp/remote"):
        answer = WEB.post(f"{gateway.url}{path}", json={"jsonrpc": "2.0", "id": 1,
                                                          "method": "tools/list"})
        challenge = answer.headers["www-authenticate"]
        metadata_url = challenge.split('resource_metadata="')[1].rstrip('"')
        described = WEB.get(metadata_url).json()

        assert answer.status_code == 401
        assert metadata_url == f"{gateway.url}/.well-known/oauth-protected-resource{path}"
        assert described["resource"] == f"{gateway.url}{path}"
        assert described["bearer_methods_supported"] == ["header"]


def test_a_wrong_key_is_refused_by_the_sdk_client(gateway: GatewayProcess) -> None:
    async def story() -> None:
        async with connected(f"{gateway.url}/mcp", "not-a-key-000000") as client:
            await client.list_tools()

    with pytest.raises(BaseException):  # noqa: B017 - the SDK raises from its task group
        run(story())


def test_one_server_s_path_serves_its_tools_under_the_same_names(
        gateway: GatewayProcess) -> None:
    async def story() -> tuple[list[str], Any]:
        async with connected(f"{gateway.url}/mcp/local", KEY) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            with pytest.raises(MCPError) as refused:
                await client.call_tool("remote_echo", {"text": "not here"})
            return names, refused.value

    names, refused = run(story())
    missing = WEB.post(f"{gateway.url}/mcp/nowhere", headers={"authorization": f"Bearer {KEY}"},
                         json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})

    assert names == ["local_add", "local_env", "local_pid", "local_crash"]
    assert "Unknown tool: remote_echo" in str(refused)
    assert missing.status_code == 404


def _post(gateway: GatewayProcess, body: dict[str, Any], **headers: str) -> httpx.Response:
    return WEB.post(f"{gateway.url}/mcp", json=body,
                      headers={"authorization": f"Bearer {KEY}",
                               "accept": "application/json, text/event-stream", **headers})


def test_an_old_revision_session_ends_with_delete_and_is_404_after(
        gateway: GatewayProcess) -> None:
    opened = _post(gateway, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"}}})
    session = opened.headers["mcp-session-id"]
    headers = {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
    listed = _post(gateway, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, **headers)
    ended = WEB.delete(f"{gateway.url}/mcp", headers={"authorization": f"Bearer {KEY}",
                                                        **headers})
    after = _post(gateway, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, **headers)

    assert opened.json()["result"]["protocolVersion"] == "2025-11-25"
    assert len(listed.json()["result"]["tools"]) == 8
    assert ended.status_code == 200
    assert after.status_code == 404


def test_an_unsupported_protocol_version_is_400_and_a_missing_session_too(
        gateway: GatewayProcess) -> None:
    unsupported = _post(gateway, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        **{"mcp-protocol-version": "1999-01-01"})
    sessionless = _post(gateway, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        **{"mcp-protocol-version": "2025-11-25"})
    unknown = _post(gateway, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                    **{"mcp-protocol-version": "2025-11-25", "mcp-session-id": "made-up"})

    assert unsupported.status_code == 400
    assert unsupported.json()["error"]["data"]["requested"] == "1999-01-01"
    assert sessionless.status_code == 400
    assert unknown.status_code == 404


def test_a_result_over_the_server_s_bound_is_a_tool_error(tmp_path: Path, remote: FakeMcp
                                                          ) -> None:
    doc = mcp_config(remote)
    doc["mcp_servers"]["remote"]["max_result_bytes"] = 2048
    gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
    try:
        async def story() -> Any:
            async with connected(f"{gateway.url}/mcp", KEY) as client:
                return (await client.call_tool("remote_big", {"size": 500}),
                        await client.call_tool("remote_big", {"size": 5000}))

        small, large = run(story())
    finally:
        gateway.stop()

    assert not small.is_error
    assert large.is_error and "over the 2048" in large.content[0].text


def test_names_fit_every_client_and_are_stable() -> None:
    long = namespaced("search", "find_" + "x" * 80)
    odd = namespaced("docs", "read.file")

    assert namespaced("docs", "search") == "docs_search"
    assert namespaced("docs", "search", "__") == "docs__search"
    assert valid(long) and len(long) + CLIENT_PREFIX <= MAX_NAME
    assert long == namespaced("search", "find_" + "x" * 80)  # the same name every time
    assert long != namespaced("search", "find_" + "x" * 81)
    assert valid(odd) and odd.startswith("docs_read_file-")
