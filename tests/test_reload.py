"""Editing llms.json reorders providers without a restart; a broken edit keeps the last good one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.gateway_process import ROOT, GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, status

MESSAGES = [{"role": "user", "content": "hello"}]


def served_by(gateway: GatewayProcess) -> str | None:
    response = httpx.post(f"{gateway.base_url}/chat/completions",
                          json={"model": "m", "messages": MESSAGES})
    return response.headers.get("x-llms-provider") if response.status_code == 200 else None


def wait_until_served_by(gateway: GatewayProcess, name: str) -> None:
    wait_until(lambda: served_by(gateway) == name, within=30, what=f"served by {name}")


def test_reordering_providers_in_the_file_takes_effect_without_restart(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    first = config({"a": provider(a.base_url, {"m": "m"}), "b": provider(b.base_url, {"m": "m"})})
    gateway = start_gateway(first)
    pid = gateway.process.pid if gateway.process else None
    assert served_by(gateway) == "a"

    gateway.write_config(config({"b": provider(b.base_url, {"m": "m"}),
                                 "a": provider(a.base_url, {"m": "m"})}))

    wait_until_served_by(gateway, "b")
    assert gateway.process is not None and gateway.process.pid == pid
    assert gateway.log_events("config_reloaded")[-1]["providers"] == ["b", "a"]


def test_a_broken_edit_is_logged_and_the_last_good_config_keeps_serving(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a = upstream_factory("a")
    gateway = start_gateway(config({"a": provider(a.base_url, {"m": "m"})}))

    gateway.write_config('{"providers": {"a": {"type": "openai", "timeouts": {"connect": "soon"}')
    syntax = gateway.wait_for_log("config_reload_failed")[-1]
    assert str(gateway.config_path) in syntax["error"] and "line" in syntax["error"]
    assert served_by(gateway) == "a"

    bad_field = config({"a": provider(a.base_url, {"m": "m"}, timeouts={"connect": "soon"})})
    gateway.write_config(bad_field)
    error = gateway.wait_for_log("config_reload_failed", count=2)[-1]["error"]
    assert "providers.a.timeouts" in error and "connect" in error
    assert served_by(gateway) == "a"


def test_invalid_config_at_startup_exits_non_zero_naming_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "llms.json"
    path.write_text('{"providers": {"x": {"type": "openai", "base_url": "http://h/v1", '
                    '"retries": {"attempts": "many"}}}}')

    result = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)

    assert result.returncode != 0
    assert str(path) in result.stderr
    assert "providers.x.retries" in result.stderr and "attempts" in result.stderr


def test_unknown_provider_type_is_a_startup_error(tmp_path: Path) -> None:
    path = tmp_path / "llms.yaml"
    path.write_text("providers:\n  x:\n    type: telepathy\n    models: {m: m}\n")

    result = subprocess.run([sys.executable, "-m", "gateway", "serve", "--config", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=30)

    assert result.returncode == 2
    assert "providers.x.type: unknown provider type 'telepathy'" in result.stderr


def test_yaml_config_is_accepted(start_gateway: Callable[..., GatewayProcess],
                                 upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a = upstream_factory("a")
    yaml_text = (f"providers:\n  a:\n    type: openai\n    base_url: {a.base_url}\n"
                 f"    models:\n      m: upstream-m\n")
    gateway = start_gateway(config({}), filename="llms.yaml")
    gateway.write_config(yaml_text)

    wait_until_served_by(gateway, "a")
    assert a.last_json["model"] == "upstream-m"


def test_a_removed_provider_s_circuit_is_forgotten_by_ready_and_metrics(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    a, doomed = upstream_factory("a"), upstream_factory("doomed")
    doomed.set_mode(status(503))
    both = {"doomed": provider(doomed.base_url, {"m": "m"}), "a": provider(a.base_url, {"m": "m"})}
    gateway = start_gateway(config(both, defaults={"circuit": {"failures": 1}}))
    assert served_by(gateway) == "a", "doomed failed, its circuit opened, a answered"

    def circuits() -> str:
        """The circuit series of /metrics (counters keep their history), and /ready."""
        lines = httpx.get(f"{gateway.url}/metrics").text.splitlines()
        return "\n".join(line for line in lines if line.startswith("llms_circuit_state")) \
            + httpx.get(f"{gateway.url}/ready").text

    assert 'provider="doomed"' in circuits()
    gateway.write_config(config({"a": provider(a.base_url, {"m": "m"})},
                                defaults={"circuit": {"failures": 1}}))
    wait_until(lambda: gateway.log_events("config_reloaded")
               and gateway.log_events("config_reloaded")[-1]["providers"] == ["a"])
    assert "doomed" not in circuits()


def test_a_keyless_provider_is_logged_once_not_at_every_reload(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    """One `provider_disabled` line per provider and reason: reloads that leave it disabled for
    the same reason add none; a new reason is logged once more."""
    a = upstream_factory("a")

    def doc(variable: str, alias: str) -> dict[str, Any]:
        return config({"a": provider(a.base_url, {alias: alias}),
                       "keyless": {**provider(a.base_url, {"m": "m"}), "api_key": variable}})

    gateway = start_gateway(doc("$UNSET_KEY_ONE", "m"))
    for count, alias in enumerate(("m2", "m3", "m4"), 2):  # three edits, each a reload
        gateway.write_config(doc("$UNSET_KEY_ONE", alias))
        wait_until(lambda count=count: len(gateway.log_events("config_reloaded")) >= count - 1)
    gateway.write_config(doc("$UNSET_KEY_TWO", "m5"))
    wait_until(lambda: len(gateway.log_events("config_reloaded")) >= 4)

    lines = [(e["provider"], e["reason"]) for e in gateway.log_events("provider_disabled")]
    assert lines == [("keyless", "UNSET_KEY_ONE is not set"),
                     ("keyless", "UNSET_KEY_TWO is not set")]
