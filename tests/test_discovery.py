"""`"models": "*"`: new upstream models appear in /v1/models without editing the file."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.fake_ollama import FakeOllama
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, refusing_url
from tests.waiting import wait_until


def model_ids(gateway: GatewayProcess) -> list[str]:
    return [m["id"] for m in httpx.get(f"{gateway.base_url}/models").json()["data"]]


def wait_for_models(gateway: GatewayProcess, expected: list[str], within: float = 30) -> None:
    wait_until(lambda: model_ids(gateway) == expected, within=within,
               what=f"/v1/models listing {expected}")


def test_listed_models_are_served_and_new_ones_appear(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    with FakeUpstream(name="vllm", models=("alpha", "beta", "text-embed-3")) as up:
        gateway = start_gateway(config({
            "vllm": provider(up.base_url, "*", exclude=["*embed*"], discover_interval=0.3),
            "broken": provider(refusing_url(), "*", discover_interval=0.3),
        }))
        wait_for_models(gateway, ["alpha", "beta"])

        answer = httpx.post(f"{gateway.base_url}/chat/completions",
                            json={"model": "beta", "messages": [{"role": "user", "content": "x"}]})
        assert answer.headers["x-llms-provider"] == "vllm"
        assert up.last_json["model"] == "beta"

        up.models = ("alpha", "beta", "gamma")
        wait_for_models(gateway, ["alpha", "beta", "gamma"])
        assert len(gateway.log_events("model_discovery_failed")) == 1, "logged once, not per try"


def test_ollama_models_come_from_api_tags(start_gateway: Callable[..., GatewayProcess]) -> None:
    with FakeOllama(name="ollama", models=("llama3.2:3b", "qwen3:8b")) as ollama:
        gateway = start_gateway(config({
            "ollama": {"type": "ollama", "base_url": ollama.base_url, "models": "*",
                       "include": ["qwen*"], "discover_interval": 0.3},
        }))
        wait_for_models(gateway, ["qwen3:8b"])

        answer = httpx.post(f"{gateway.base_url}/chat/completions",
                            json={"model": "qwen3:8b",
                                  "messages": [{"role": "user", "content": "x"}]})
        assert answer.json()["choices"][0]["message"]["content"] == "Hello from ollama"
