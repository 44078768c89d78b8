"""/v1/models lists what the enabled providers serve; /health and /ready say what they should."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.conftest import Pair
from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.upstream import FakeUpstream, refusing_url


def test_models_is_the_union_of_aliases_in_file_order(pair: Pair) -> None:
    models = pair.client().models.list()

    assert [m.id for m in models.data] == ["chat-model", "primary-only"]
    assert models.data[0].owned_by == "primary"
    validate(httpx.get(f"{pair.gateway.base_url}/models").json(), "ListModelsResponse")


def test_one_model_by_id_including_ids_with_slashes(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway(config({
        "p": provider(refusing_url(), {"moonshotai/kimi-k2.5": "kimi", "plain": "plain"}),
    }))

    found = httpx.get(f"{gateway.base_url}/models/moonshotai/kimi-k2.5")
    missing = httpx.get(f"{gateway.base_url}/models/absent")

    assert found.status_code == 200
    validate(found.json(), "Model")
    assert found.json()["id"] == "moonshotai/kimi-k2.5"
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_disabled_and_keyless_providers_are_not_listed(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({
        "keyless": {"type": "openai", "base_url": up.base_url, "api_key": "$UNSET_KEY_FOR_TEST",
                    "models": {"hidden-a": "a"}},
        "off": provider(up.base_url, {"hidden-b": "b"}, enabled=False),
        "on": provider(up.base_url, {"shown": "s"}),
    }), env={"UNSET_KEY_FOR_TEST": ""})

    ids = [m["id"] for m in httpx.get(f"{gateway.base_url}/models").json()["data"]]
    ready = httpx.get(f"{gateway.url}/ready").json()

    assert ids == ["shown"]
    reasons = {p["name"]: p["reason"] for p in ready["providers"]}
    assert reasons == {"keyless": "UNSET_KEY_FOR_TEST is not set", "off": "disabled in config",
                       "on": None}
    assert any("UNSET_KEY_FOR_TEST is not set" in line for line in gateway.logs().splitlines())


def test_health_and_ready(pair: Pair) -> None:
    assert httpx.get(f"{pair.gateway.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{pair.gateway.url}/ready")
    assert ready.status_code == 200
    assert [p["name"] for p in ready.json()["providers"]] == ["primary", "secondary"]
    assert pair.primary.requests == [], "health checks never call upstreams"


def test_not_ready_when_no_provider_is_enabled(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    gateway = start_gateway(config({
        "keyless": {"type": "openai", "base_url": "http://127.0.0.1:9/v1",
                    "api_key": "$SURELY_UNSET_KEY", "models": {"m": "m"}},
    }))

    ready = httpx.get(f"{gateway.url}/ready")
    chat = httpx.post(f"{gateway.base_url}/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})

    assert ready.status_code == 503
    assert ready.json()["reason"] == "no provider is enabled"
    assert httpx.get(f"{gateway.url}/health").status_code == 200
    assert chat.status_code == 404
