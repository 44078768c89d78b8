"""docs/mcp.md as a user follows it: its llms.json loads as written (its secrets from the
environment, each kept out of every answer), and its Python SDK snippet runs against a gateway
as it stands, only the address changed. Its Claude Code `--mcp-config` is what
tests/test_mcp_claude_code.py runs Claude Code with."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from gateway.config.loader import parse
from gateway.config.snapshots import secrets
from tests.gateway_process import ROOT, GatewayProcess, config

DOC = (ROOT / "docs" / "mcp.md").read_text()
KEY = "client-key-mcp-docs1"


def block(marker: str, language: str) -> str:
    """The first `language` block after the comment naming `marker`."""
    after = DOC[DOC.index(marker):]
    found = re.search(rf"```{language}\n(.*?)```", after, re.DOTALL)
    assert found is not None, marker
    return found.group(1)


def test_the_documented_llms_json_loads_with_its_secrets_from_the_environment() -> None:
    text = block("tests/test_mcp_docs.py loads this block", "json")
    environ = {"LLMS_GATEWAY_KEY": KEY, "DOCS_MCP_AUTHORIZATION": "Bearer docs-token-123456",
               "SEARCH_CLIENT_SECRET": "search-secret-7890"}

    snapshot = parse(text, Path("llms.json"), environ)
    servers = {server.name: server for server in snapshot.mcp_servers}

    assert list(servers) == ["docs", "search", "files"]
    assert dict((k, v.reveal()) for k, v in servers["docs"].headers) == {
        "Authorization": "Bearer docs-token-123456"}
    assert servers["search"].oauth is not None
    assert servers["search"].oauth.client_secret == "search-secret-7890"
    assert servers["files"].command[0] == "npx" and servers["files"].max_result_bytes == 1048576
    assert {"docs-token-123456", "search-secret-7890"} <= set(secrets(snapshot))
    assert snapshot.mcp.tool_calls_per_minute == 600


def test_the_documented_sdk_snippet_runs_against_a_gateway(tmp_path: Path) -> None:
    doc = config({}, server={"api_keys": [KEY]})
    doc["mcp_servers"] = {"local": {"command": [sys.executable, "tests/mcp_stdio_server.py"]}}
    gateway = GatewayProcess(tmp_path, doc).start(timeout=60)
    try:
        snippet = block("tests/test_mcp_docs.py runs this block", "python")
        done = subprocess.run([sys.executable, "-c",
                               snippet.replace("http://localhost:8000", gateway.url)],
                              env={"LLMS_GATEWAY_KEY": KEY, "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=120, check=False)
    finally:
        gateway.stop()

    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "['local_add', 'local_env', 'local_pid', 'local_crash']", "{'result': 5}"]


def claude_code_config(url: str, key: str) -> str:
    """docs/mcp.md's `--mcp-config` for Claude Code, pointed at `url` with `key`."""
    text = block("tests/test_mcp_claude_code.py runs Claude Code", "json")
    return json.dumps(json.loads(text.replace("http://localhost:8000", url)
                                 .replace("YOUR_GATEWAY_KEY", key)))
