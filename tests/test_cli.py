"""The `llms-gateway` command: ls explains each provider, check probes them, chat streams."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.cli_ls import worker_line
from gateway.config.loader import state_dir
from tests.conftest import Pair
from tests.gateway_process import ROOT, GatewayProcess, config, free_port, provider, wait_until
from tests.upstream import FakeUpstream, refusing_url, status


def run(*args: str, env: dict[str, str] | None = None,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, input=stdin,
                          env={**os.environ, **(env or {})})


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
        "found": provider("http://127.0.0.1:9/v1", "*"),
    }, server={"port": free_port()}))  # no gateway there: the config's view

    result = run("ls", "--config", str(path))

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    local = next(i for i, line in enumerate(lines) if " local " in line)
    remote = next(i for i, line in enumerate(lines) if " remote " in line)
    assert local < remote
    assert "enabled" in lines[local]
    assert lines[remote].endswith("disabled (NOT_SET_KEY_XYZ is not set)")
    assert "small -> small-upstream" in result.stdout
    assert "* (discovered at start)" in result.stdout
    assert "this is the config's view" in lines[-1]
    assert lines[1] == f"its state in {state_dir({**os.environ}, path)}"


def test_ls_asks_the_running_gateway_for_each_provider_s_live_state(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    """What only the running gateway knows: an admin switched one off, one's circuit is open,
    one discovered its models."""
    broken, good = upstream_factory("broken"), upstream_factory("good")
    broken.set_mode(status(500, message="exploded"))
    with FakeUpstream(name="lister", models=("alpha", "beta")) as lister:
        doc = config({
            "broken": provider(broken.base_url, {"m": "broken-m"},
                               circuit={"failures": 1, "open_for": 600}),
            "good": provider(good.base_url, {"m": "good-m"}),
            "switched": provider(good.base_url, {"m": "m"}),
            "keyless": {**provider(good.base_url, {"m": "m"}), "api_key": "$NOT_SET_KEY_XYZ"},
            "lister": provider(lister.base_url, "*", discover_interval=0.3),
        })
        gateway = GatewayProcess(tmp_path, doc)
        doc["server"]["port"] = gateway.port  # `ls` finds the gateway where the config says
        gateway.write_config(doc)
        gateway.start()
        try:
            httpx.post(f"{gateway.base_url}/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            httpx.post(f"{gateway.url}/admin/providers/switched/disable")
            wait_until(lambda: "beta" in httpx.get(f"{gateway.base_url}/models").text)
            result = run("ls", "--config", str(gateway.config_path))
        finally:
            gateway.stop()

    assert result.returncode == 0, result.stderr
    states = {line.split()[1]: line.split(None, 3)[3] for line in result.stdout.splitlines()
              if line[:3].strip().isdigit()}
    assert states == {"broken": "circuit open (broken-m)", "good": "enabled",
                      "switched": "disabled by an admin",
                      "keyless": "disabled (NOT_SET_KEY_XYZ is not set)", "lister": "enabled"}
    assert "alpha  (discovered)" in result.stdout and "beta  (discovered)" in result.stdout
    assert "config's view" not in result.stdout


def test_ls_prints_a_worker_s_time_in_state_and_its_load_time_apart() -> None:
    """README's `ls` line: the time in state is never worded as the load time."""
    seen = {"name": "local-0", "url": "http://127.0.0.1:8101/v1", "state": "ready",
            "for_s": 200.4, "load_s": 4.21, "inflight": 0, "restarts": 0}
    line = worker_line(seen)
    remote = worker_line({**seen, "name": "remote-0", "for_s": 9.0, "load_s": None})
    slow = worker_line({**seen, "state": "starting", "for_s": 7384.0, "load_s": None,
                        "last_error": "exited (code 1)"})

    assert "ready for 3m20s, loaded in 4.2s " in line and line.endswith("restarts 0")
    assert "ready for 9.0s " in remote and "loaded" not in remote
    assert "starting for 2h03m " in slow and slow.endswith("(exited (code 1))")
    readme = (ROOT / "README.md").read_text()
    assert "ready for 3m20s, loaded in 4.2s" in readme, "README shows what ls prints"


def test_check_reports_each_provider_and_fails_when_one_is_down(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    good, bad = upstream_factory("good"), upstream_factory("bad")
    bad.set_mode(status(503, message="exploded"))
    good.models = ("alpha", "beta")
    path = write(tmp_path, config({
        "good": provider(good.base_url, {"m": "good-m"}),
        "bad": provider(bad.base_url, {"m": "bad-m"}),
        "down": provider(refusing_url(), {"m": "m"}),
        "lister": provider(good.base_url, "*"),
    }))

    everything = run("check", "--config", str(path))
    only_good = run("check", "good", "--config", str(path))

    assert everything.returncode == 1
    assert "good" in everything.stdout and " ms  ok" in everything.stdout
    assert "error: 503 exploded" in everything.stdout, "the upstream's own status"
    assert "error: unavailable:" in everything.stdout, "no status: what kind of failure"
    assert "lister         * (listing)" in everything.stdout
    assert "ok: lists 2 models" in everything.stdout
    assert only_good.returncode == 0
    assert good.requests[-1].json["model"] == "good-m"
    assert "bad" not in only_good.stdout


def test_chat_streams_an_answer_through_a_running_gateway(pair: Pair) -> None:
    result = run("chat", "-m", "chat-model", "hello there", "--url", pair.gateway.base_url)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Hello from primary"
    assert pair.primary.last_json["stream"] is True


def test_chat_sends_the_system_message_and_sampling_options(pair: Pair) -> None:
    result = run("chat", "-m", "chat-model", "hello", "--url", pair.gateway.base_url,
                 "--system", "Be brief.", "--max-tokens", "7", "--temperature", "0.2")

    assert result.returncode == 0, result.stderr
    sent = pair.primary.last_json
    assert sent["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "hello"}]
    assert (sent["max_tokens"], sent["temperature"]) == (7, 0.2)


def test_chat_without_a_prompt_holds_a_conversation_until_exit(pair: Pair) -> None:
    result = run("chat", "-m", "chat-model", "--url", pair.gateway.base_url,
                 "--system", "Be brief.", stdin="first\n\nsecond\n/exit\nnever sent\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Hello from primary", "Hello from primary"]
    assert pair.primary.last_json["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "Hello from primary"},
        {"role": "user", "content": "second"}]
    assert not any("never sent" in str(r.json) for r in pair.primary.requests)


def test_chat_conversation_ends_at_end_of_input(pair: Pair) -> None:
    result = run("chat", "-m", "chat-model", "--url", pair.gateway.base_url, stdin="only\n")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["Hello from primary"]


def test_version_is_the_installed_package_s() -> None:
    result = run("--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"llms-gateway {importlib.metadata.version('llms-gateway')}"


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
    # The operator's price for gpt-4o-mini (on `priced`) is its price by every name.
    assert "$1/$2 per M tokens in/out (config)" in lines["mini"]
    assert "output 16384 (config)" in lines["priced"]
    assert "$1/$2 per M tokens in/out (config)" in lines["priced"]
    assert lines["own"].endswith("window 8192 (config)")
    assert "claude-* -> own" in lines["claude-*"]


def test_a_listing_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    import json

    path = tmp_path / "llms.json"
    path.write_text(json.dumps({"providers": {"up": {
        "type": "openai", "base_url": "http://127.0.0.1:9/v1",
        "models": {f"model-{i:05d}": f"upstream-{i}" for i in range(5000)}}}}))
    listing = subprocess.Popen(
        [sys.executable, "-m", "gateway", "ls", "--config", str(path), "--url", refusing_url()],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert listing.stdout is not None and listing.stderr is not None

    first = listing.stdout.readline()  # `| head -1`: one line read, then the pipe is closed
    listing.stdout.close()
    errors = listing.stderr.read()
    code = listing.wait(timeout=60)

    assert first.startswith(str(path).encode())
    assert (code, errors) == (0, b"")
