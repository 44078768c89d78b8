"""The process supervises itself: a background task that crashes is logged with its traceback,
restarted, and shown on the status page, and the rest of the gateway carries on."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis

from gateway.state.supervise import MAX_BACKOFF, backoff
from tests import plugins
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, ok

# A third-party kind whose model listing has a bug: discovery calls it on a timer.
CRASHING_DISCOVERY = """
    from providers.contract.provider import Provider

    class Kind(Provider):
        async def send(self, request, upstream_model):
            raise NotImplementedError

        async def stream(self, request, upstream_model):
            raise NotImplementedError
            yield b""

        async def list_models(self):
            raise RuntimeError("listing bug")
"""


def _status(gateway: GatewayProcess) -> dict[str, Any]:
    return httpx.get(f"{gateway.url}/status.json").json()


def test_a_crashing_task_is_logged_restarted_and_shown_while_the_gateway_carries_on(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    a, b = upstream_factory("a"), upstream_factory("b")
    env = plugins.install(tmp_path, "flaky", CRASHING_DISCOVERY)
    discovering = {"type": "flaky", "models": "*", "discover_interval": 0.2}
    gateway = start_gateway(config({"a": provider(a.base_url, {"m": "m"}),
                                    "flaky": discovering}), env=env)

    failed = gateway.wait_for_log("background_task_failed", count=2, timeout=10)

    assert failed[0]["task"] == "model_discovery" and "listing bug" in failed[0]["error"]
    assert "Traceback" in failed[0]["exception"]
    wait_until(lambda: any(t["name"] == "model_discovery" and t["restarts"] >= 2
                          for t in _status(gateway)["tasks"]))
    tasks = {t["name"]: t for t in _status(gateway)["tasks"]}
    assert "listing bug" in tasks["model_discovery"]["last_error"]
    assert tasks["config_reload"]["restarts"] == 0
    # The gateway still answers, and still reloads its config.
    gateway.write_config(config({"b": provider(b.base_url, {"m": "m"}), "flaky": discovering}))
    wait_until(lambda: httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]}).headers.get(
        "x-llms-provider") == "b")


def test_a_malformed_field_in_redis_is_skipped_not_a_crash_of_every_workers_sync(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], redis_server: Any) -> None:
    a = upstream_factory("a")
    gateway = start_gateway(config({"a": provider(a.base_url, {"m": "m"})},
                                   state={"backend": "redis", "url": redis_server.url,
                                          "sync_interval": 0.1}))
    client = redis.Redis.from_url(redis_server.url)
    client.hset("llms-gateway:health", mapping={"a\x1fm": b"not json", "\xff": b"[1]"})

    gateway.wait_for_log("shared_state_value_ignored")
    redis_server.synced(gateway)  # and a whole sync since

    assert not gateway.log_events("background_task_failed")
    assert all(t["restarts"] == 0 for t in _status(gateway)["tasks"])
    assert client.hlen("llms-gateway:health") == 0  # dropped, so it is not read again
    client.close()


def test_the_backoff_doubles_from_half_a_second_and_is_capped() -> None:
    assert [backoff(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff(50) == MAX_BACKOFF


def test_sigterm_ends_a_stream_longer_than_the_drain_with_an_in_band_error_and_says_why(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    up.set_mode(ok(content=" ".join(["word"] * 100), delay_between_chunks=0.1))  # 10 s
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})},
                                   server={"drain_timeout": 1}))
    assert gateway.process is not None

    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "stream": True}) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        os.killpg(gateway.process.pid, signal.SIGTERM)
        rest = [line for line in lines if line]

    assert "[DONE]" not in rest[-1]
    assert json.loads(rest[-1][6:])["error"]["code"] == "server_shutting_down"
    assert gateway.process.wait(timeout=15) in (0, -signal.SIGTERM)
    assert gateway.log_events("shutdown_cutting_streams")
    request = gateway.log_events("request")[-1]
    assert (request["outcome"], request["reason"]) == ("error", "shutdown")
