"""A config edit never weakens the gateway: a reload that would turn auth off, leave no provider,
or cannot be read is refused; the last good config keeps serving, and the operator sees why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import httpx

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, ok

KEY = "gw-key-00000001"
MESSAGES = [{"role": "user", "content": "hello"}]


def _chat(gateway: GatewayProcess, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gateway.base_url}/chat/completions", headers=headers, timeout=30,
                      json={"model": "m", "messages": MESSAGES})


def _status(gateway: GatewayProcess) -> dict[str, Any]:
    return httpx.get(f"{gateway.url}/status.json",
                     headers={"Authorization": f"Bearer {KEY}"}).json()


def _write_bytes(gateway: GatewayProcess, data: bytes) -> None:
    scratch = gateway.config_path.with_suffix(".tmp")
    scratch.write_bytes(data)
    scratch.replace(gateway.config_path)


def _keyed(a: FakeUpstream, b: FakeUpstream, key_ref: str = "$GW_KEY",
           **server: Any) -> dict[str, Any]:
    return config({"a": provider(a.base_url, {"m": "m"}), "b": provider(b.base_url, {"m": "m"})},
                  server={"api_keys": [key_ref], **server})


def test_a_misspelt_key_variable_is_refused_and_the_gateway_still_demands_the_key(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    gateway = start_gateway(_keyed(a, b), env={"GW_KEY": KEY})

    gateway.write_config(_keyed(a, b, key_ref="$GW_KY"))
    refused = gateway.wait_for_log("config_reload_failed")[-1]

    assert refused["level"] == "error"
    assert "refused" in refused["error"] and "api_keys" in refused["error"]
    assert _chat(gateway, key=None).status_code == 401
    assert _chat(gateway).status_code == 200
    shown = _status(gateway)["config"]["last_reload_error"]
    assert shown is not None and "api_keys" in shown["error"]

    gateway.write_config(config({"b": provider(b.base_url, {"m": "m"})},
                                server={"api_keys": ["$GW_KEY"]}))
    wait_until(lambda: _chat(gateway).headers.get("x-llms-provider") == "b")
    assert _status(gateway)["config"]["last_reload_error"] is None


def test_an_empty_providers_map_is_refused(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    gateway = start_gateway(_keyed(a, b), env={"GW_KEY": KEY})

    gateway.write_config(config({}, server={"api_keys": ["$GW_KEY"]}))

    assert "providers is empty" in gateway.wait_for_log("config_reload_failed")[-1]["error"]
    assert _chat(gateway).headers["x-llms-provider"] == "a"


def test_an_oversized_config_is_refused_with_its_size_and_the_limit(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    gateway = start_gateway(_keyed(a, b), env={"GW_KEY": KEY})
    huge = _keyed(a, b)
    huge["providers"]["a"]["params"] = {"padding": "x" * (6 * 1024 * 1024)}

    gateway.write_config(huge)

    error = gateway.wait_for_log("config_reload_failed")[-1]["error"]
    assert "bytes, over the" in error
    assert _chat(gateway).headers["x-llms-provider"] == "a"


def test_unreadable_edits_are_refused_and_the_watcher_keeps_watching(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    gateway = start_gateway(_keyed(a, b), env={"GW_KEY": KEY})
    good = json.dumps(_keyed(a, b)).encode()

    _write_bytes(gateway, good.replace(b'"m"', b'"m\xff"', 1))
    gateway.wait_for_log("config_reload_failed")
    _write_bytes(gateway, b'{"providers": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    gateway.wait_for_log("config_reload_failed", count=2)
    errors = [e["error"] for e in gateway.log_events("config_reload_failed")]

    assert "not UTF-8" in errors[0]
    assert "nested too deeply" in errors[1]
    gateway.write_config(config({"b": provider(b.base_url, {"m": "m"})},
                                server={"api_keys": ["$GW_KEY"]}))
    wait_until(lambda: _chat(gateway).headers.get("x-llms-provider") == "b")


def _stream_text(gateway: GatewayProcess, into: list[str]) -> None:
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as response:
        for line in response.iter_lines():  # one by one: the test watches them come
            if line:
                into.append(line)


def _workers(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def test_sighup_reloads_the_config_and_an_open_stream_still_finishes(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    a.set_mode(ok(chunks=["one ", "two ", "three ", "four"], delay_between_chunks=0.5))
    # A poll far slower than the test: only the signal can make the edit live in time.
    gateway = start_gateway(_keyed(a, b, reload_interval=600), env={"GW_KEY": KEY})
    assert gateway.process is not None
    lines: list[str] = []
    streaming = threading.Thread(target=_stream_text, args=(gateway, lines))
    streaming.start()
    wait_until(lambda: lines, what="the stream's first event")
    gateway.write_config(config({"b": provider(b.base_url, {"m": "m"})},
                                server={"api_keys": ["$GW_KEY"], "reload_interval": 600}))

    for worker in _workers(gateway.process.pid):
        os.kill(worker, signal.SIGHUP)
    streaming.join(30)

    assert lines[-1] == "data: [DONE]", lines
    assert "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in lines[:-1] if json.loads(line[6:])["choices"]) == "one two three four"
    wait_until(lambda: _chat(gateway).headers.get("x-llms-provider") == "b")
    assert gateway.process.poll() is None


def test_sighup_to_the_server_process_reloads_in_place_keeping_streams_and_switches(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b, c = upstream_factory("a"), upstream_factory("b"), upstream_factory("c")
    # Longer than the drain: a worker respawned under it would cut this stream.
    a.set_mode(ok(chunks=[f"{n} " for n in range(8)], delay_between_chunks=0.75))
    server = {"api_keys": ["$GW_KEY"], "reload_interval": 600, "drain_timeout": 1}
    three = {name: provider(u.base_url, {"m": "m"}) for name, u in (("a", a), ("b", b), ("c", c))}
    gateway = start_gateway(config(three, server=server), env={"GW_KEY": KEY})
    assert gateway.process is not None
    workers = _workers(gateway.process.pid)
    lines: list[str] = []
    streaming = threading.Thread(target=_stream_text, args=(gateway, lines))
    streaming.start()
    wait_until(lambda: lines, what="the stream's first event")
    # An operator's switch the edit does not mention: a respawned worker would forget it.
    assert httpx.post(f"{gateway.url}/admin/providers/b/disable").status_code == 200
    gateway.write_config(config({"b": three["b"], "c": three["c"]}, server=server))

    os.kill(gateway.process.pid, signal.SIGHUP)
    wait_until(lambda: _chat(gateway).headers.get("x-llms-provider") == "c")
    streaming.join(30)

    assert lines[-1] == "data: [DONE]", lines
    assert "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content", "")
        for line in lines[:-1] if json.loads(line[6:])["choices"]) == "0 1 2 3 4 5 6 7 "
    assert _workers(gateway.process.pid) == workers
    assert gateway.process.poll() is None
