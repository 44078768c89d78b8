"""The `llms-gateway` command: ls explains each provider, check probes them, chat streams."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import Pair
from tests.gateway_process import ROOT, config, provider
from tests.upstream import FakeUpstream, refusing_url, status


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, env={**os.environ, **(env or {})})


def write(tmp_path: Path, doc: dict) -> Path:
    import json

    path = tmp_path / "llms.json"
    path.write_text(json.dumps(doc))
    return path


def test_ls_lists_providers_in_order_with_why_disabled(tmp_path: Path) -> None:
    path = write(tmp_path, config({
        "local": provider("http://127.0.0.1:9/v1", {"small": "small-upstream"}),
        "remote": {"type": "openai", "base_url": "http://r/v1", "api_key": "$NOT_SET_KEY_XYZ",
                   "models": {"big": "big"}},
    }))

    result = run("ls", "--config", str(path))

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    local = next(i for i, line in enumerate(lines) if " local " in line)
    remote = next(i for i, line in enumerate(lines) if " remote " in line)
    assert local < remote
    assert "enabled" in lines[local]
    assert "disabled: NOT_SET_KEY_XYZ is not set" in lines[remote]
    assert "small -> small-upstream" in result.stdout


def test_check_reports_each_provider_and_fails_when_one_is_down(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    good, bad = upstream_factory("good"), upstream_factory("bad")
    bad.set_mode(status(500, message="exploded"))
    path = write(tmp_path, config({
        "good": provider(good.base_url, {"m": "good-m"}),
        "bad": provider(bad.base_url, {"m": "bad-m"}),
        "down": provider(refusing_url(), {"m": "m"}),
    }))

    everything = run("check", "--config", str(path))
    only_good = run("check", "good", "--config", str(path))

    assert everything.returncode == 1
    assert "good" in everything.stdout and " ms  ok" in everything.stdout
    assert "error: 502 exploded" in everything.stdout
    assert only_good.returncode == 0
    assert good.requests[-1].json["model"] == "good-m"
    assert "bad" not in only_good.stdout


def test_chat_streams_an_answer_through_a_running_gateway(pair: Pair) -> None:
    result = run("chat", "-m", "chat-model", "hello there", "--url", pair.gateway.base_url)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Hello from primary"
    assert pair.primary.last_json["stream"] is True


def test_chat_reports_a_gateway_error(pair: Pair) -> None:
    result = run("chat", "-m", "no-such-model", "hi", "--url", pair.gateway.base_url)

    assert result.returncode == 1
    assert "model_not_found" in result.stderr


def test_usage_prints_totals_from_a_running_gateway(pair: Pair) -> None:
    pair.client().chat.completions.create(model="chat-model",
                                          messages=[{"role": "user", "content": "hi"}])

    result = run("usage", "--url", pair.gateway.base_url)

    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("primary"))
    assert "chat-model" in row and int(row.split()[2]) >= 1
    assert "total cost" in result.stdout


def test_ls_says_where_each_window_and_price_came_from(tmp_path: Path) -> None:
    path = write(tmp_path, config({
        "openai": {"type": "openai", "base_url": "https://api.openai.com/v1",
                   "api_key": "$NOT_SET_KEY_XYZ", "models": {
                       "mini": "gpt-4o-mini",
                       "priced": {"id": "gpt-4o-mini", "price": {"input": 1, "output": 2},
                                  "max_output_tokens": 16384}}},
        "local": provider("http://127.0.0.1:9/v1", {"own": {"id": "x-model",
                                                            "context_window": 8192}}),
    }, models={"claude-*": {"alias_of": "own"}}))

    result = run("ls", "--config", str(path))

    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()
             if line.startswith("       ")}
    assert "window 128000 (genai-prices)" in lines["mini"]
    assert "$0.15/$0.6 per M tokens in/out (genai-prices)" in lines["mini"]
    assert "output 16384 (config)" in lines["priced"]
    assert "$1/$2 per M tokens in/out (config)" in lines["priced"]
    assert lines["own"].endswith("window 8192 (config)")
    assert "claude-* -> own" in lines["claude-*"]
