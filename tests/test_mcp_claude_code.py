"""Claude Code, the CLI from npm, with the gateway as its MCP server (`--mcp-config`): in print
mode it lists the gateway's tools, the model (an OpenAI-compatible fake behind the gateway's
Messages bridge) asks for one, Claude Code calls it through `/mcp` with the gateway key, and
the tool's answer reaches the model. The snippet it runs is docs/mcp.md's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.test_claude_code import cli as cli  # the fixture: the installed CLI, or a skip
from tests.test_mcp_docs import claude_code_config
from tests.upstream import FakeUpstream, ok, tool_call

KEY = "team-key-mcp-000001"
ALIAS = "team-kimi"
FINAL = "The sum is 42."


@pytest.fixture(scope="module")
def model() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="chat") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, model: FakeUpstream
            ) -> Iterator[GatewayProcess]:
    doc = config({"chat": provider(model.base_url, {ALIAS: "kimi-k2"})},
                 defaults={"circuit": {"enabled": False}}, server={"api_keys": [KEY]},
                 models={"claude-*": {"alias_of": ALIAS}})
    doc["mcp_servers"] = {"local": {"command": [sys.executable, "tests/mcp_stdio_server.py"]}}
    process = GatewayProcess(tmp_path_factory.mktemp("claude-mcp"), doc).start(timeout=60)
    yield process
    process.stop()


def test_claude_code_calls_a_gateway_tool_over_mcp(cli: Path,
                                                   gateway: GatewayProcess,
                                                   model: FakeUpstream, tmp_path: Path) -> None:
    model.set_mode(tool_call("mcp__gateway__local_add", json.dumps({"a": 40, "b": 2})),
                   ok(FINAL))
    project = tmp_path / "project"
    project.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"),
           "ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": KEY,
           "ANTHROPIC_MODEL": ALIAS, "ANTHROPIC_SMALL_FAST_MODEL": ALIAS,
           "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}

    done = subprocess.run(
        [cli, "-p", "Add 40 and 2 with the gateway's tool", "--output-format", "json",
         "--mcp-config", claude_code_config(gateway.url, KEY), "--strict-mcp-config",
         "--allowedTools", "mcp__gateway__local_add"],
        env=env, cwd=project, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=180, check=False)

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{gateway.logs()[-2000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    assert (result["result"], result["is_error"]) == (FINAL, False)
    # Claude Code defers MCP tools behind its ToolSearch; the model named the tool all the same.
    results = [m for m in model.requests[-1].json["messages"] if m["role"] == "tool"]
    assert results and json.loads(results[-1]["content"]) == {"result": 42}
    metrics = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {KEY}"},
                        timeout=30).text
    assert 'outcome="completed"' in next(line for line in metrics.splitlines()
                                         if line.startswith("llms_mcp_tool_calls_total"))
