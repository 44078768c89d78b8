"""Prompts and resources through the MCP gateway: the official `mcp` SDK's client, on both
protocol revisions, lists and gets the prompts and lists and reads the resources of two
upstreams through `/mcp`, named as their tools are (a prompt `{server}_{name}`, a resource
`{server}+{uri}`), and through `/mcp/{server}` one server's under the same names; a key sees
only the servers its allow-list lets it use."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config
from tests.mcp_clients import REVISIONS, connected
from tests.test_mcp_docs import block
from tests.test_teams import Admin

ADMIN_KEY = "admin-mcp-catalog-01"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, remote: FakeMcp, other: FakeMcp
            ) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("mcp-catalog")
    doc = config({}, server={"admin_keys": [ADMIN_KEY]},
                 database={"url": f"sqlite:///{workdir / 'keys.db'}"})
    doc["mcp_servers"] = {"remote": {"url": remote.url}, "other": {"url": other.url}}
    gateway = GatewayProcess(workdir, doc).start(timeout=60)
    yield gateway
    gateway.stop()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.mark.parametrize("mode", REVISIONS)
def test_the_sdk_client_gets_every_server_s_prompts_and_resources_through_one_endpoint(
        gateway: GatewayProcess, mode: str) -> None:
    async def story() -> dict[str, Any]:
        async with connected(f"{gateway.url}/mcp", ADMIN_KEY, mode) as client:
            prompts = (await client.list_prompts()).prompts
            got = await client.get_prompt("other_brief", {"topic": "tides"})
            resources = (await client.list_resources()).resources
            templates = (await client.list_resource_templates()).resource_templates
            today = await client.read_resource("remote+notes://today")
            monday = await client.read_resource("other+notes://day/monday")
            return {"prompts": prompts, "got": got, "resources": resources,
                    "templates": templates, "today": today, "monday": monday}

    seen = run(story())

    assert [prompt.name for prompt in seen["prompts"]] == ["remote_brief", "other_brief"]
    assert [arg.name for arg in seen["prompts"][0].arguments] == ["topic"]
    assert seen["got"].messages[0].content.text == "Write a brief on tides for other."
    assert [(r.name, r.uri) for r in seen["resources"]] == [
        ("remote_today", "remote+notes://today"), ("other_today", "other+notes://today")]
    assert [t.uri_template for t in seen["templates"]] == [
        "remote+notes://day/{day}", "other+notes://day/{day}"]
    assert [(c.uri, c.text) for c in seen["today"].contents] == [
        ("remote+notes://today", "remote: nothing planned")]
    assert seen["monday"].contents[0].text == "other: notes of monday"


@pytest.mark.parametrize("mode", REVISIONS)
def test_one_server_s_path_serves_its_own_under_the_same_names(gateway: GatewayProcess,
                                                                 mode: str) -> None:
    async def story() -> tuple[list[str], list[str], str, MCPError, MCPError]:
        async with connected(f"{gateway.url}/mcp/remote", ADMIN_KEY, mode) as client:
            prompts = [prompt.name for prompt in (await client.list_prompts()).prompts]
            uris = [r.uri for r in (await client.list_resources()).resources]
            read = await client.read_resource("remote+notes://day/friday")
            with pytest.raises(MCPError) as elsewhere:
                await client.read_resource("other+notes://today")
            with pytest.raises(MCPError) as prompt_elsewhere:
                await client.get_prompt("other_brief", {"topic": "x"})
            return prompts, uris, read.contents[0].text, elsewhere.value, prompt_elsewhere.value

    prompts, uris, text, elsewhere, prompt_elsewhere = run(story())

    assert prompts == ["remote_brief"] and uris == ["remote+notes://today"]
    assert text == "remote: notes of friday"
    assert "Unknown resource: other+notes://today" in str(elsewhere)
    assert "Unknown prompt: other_brief" in str(prompt_elsewhere)


def test_a_key_sees_the_prompts_and_resources_of_the_servers_its_allow_list_lets_it_use(
        gateway: GatewayProcess) -> None:
    key = Admin(gateway, ADMIN_KEY).key(name="remote-echo", mcp_tools=["remote_echo"])["key"]

    async def story() -> tuple[list[str], list[str], list[str], list[str]]:
        async with connected(f"{gateway.url}/mcp", key) as client:
            prompts = [prompt.name for prompt in (await client.list_prompts()).prompts]
            uris = [r.uri for r in (await client.list_resources()).resources]
            errors = []
            for uri in ("other+notes://today", "ghost+notes://today"):
                with pytest.raises(MCPError) as refused:
                    await client.read_resource(uri)
                errors.append(str(refused.value).replace(uri.split("+")[0], "NAME"))
            refusals = []
            for name in ("other_brief", "ghost_brief"):
                with pytest.raises(MCPError) as refused:
                    await client.get_prompt(name, {"topic": "x"})
                refusals.append(str(refused.value).replace(name.split("_")[0], "NAME"))
            return prompts, uris, errors, refusals

    prompts, uris, errors, refusals = run(story())

    assert prompts == ["remote_brief"] and uris == ["remote+notes://today"]
    assert errors[0] == errors[1]  # a server it may not use is one that does not exist
    assert refusals[0] == refusals[1]


def test_the_docs_snippet_runs(gateway: GatewayProcess) -> None:
    snippet = block("tests/test_mcp_catalog.py runs this block", "python")

    ran = subprocess.run([sys.executable, "-c",
                          snippet.replace("http://localhost:8000", gateway.url)],
                         env={"LLMS_GATEWAY_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120, check=False)

    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.splitlines() == ["['remote_brief']", "Write a brief on tides for remote.",
                                       "['remote+notes://today']", "remote: nothing planned"]
