"""Guardrails beyond the prompt: an answer blocked mid-stream, policies a key or team brings,
names llms.json does not have refused, and a cache that keeps placeholders only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, Mode, echo_prompt

SECRET = "sk-proj-Zq8d7Xc2Vb9Nm4Lk1Jh6Gf3Ds5Aa0Pp"
GUARDRAILS = {"pii": {"detect": ["email"], "action": "pseudonymize"},
              "no-secrets-out": {"detect": ["secrets"], "action": "block",
                                 "phases": ["output"]}}


def _doc(upstream: FakeUpstream, **models: Any) -> dict[str, Any]:
    doc = config({"main": provider(upstream.base_url, {"m": "m", "plain": "plain"})},
                 defaults={"circuit": {"enabled": False}})
    doc["guardrails"] = GUARDRAILS
    doc["models"] = models
    return doc


def test_an_output_block_mid_stream_ends_it_with_an_error_event_the_secret_never_sent(
        start_gateway: Callable[..., GatewayProcess], upstream_factory: Callable[[str],
                                                                                FakeUpstream]
) -> None:
    upstream = upstream_factory("leaky")
    gateway = start_gateway(_doc(upstream, m={"guardrails": ["no-secrets-out"]}))
    before = "A long preamble, longer than what a stream holds back to judge it. Here it is: "
    # The preamble is sent, and read, before the secret leaves the upstream.
    upstream.set_mode(Mode("paused", chunks=(before, SECRET[:10], SECRET[10:], " enjoy"),
                           after_chunks=2))

    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=10, json={
            "model": "m", "stream": True,
            "messages": [{"role": "user", "content": "the key?"}]}) as answer:
        lines = answer.iter_lines()
        body = ""
        for line in lines:
            body += line + "\n"
            if "A long preamble" in body:
                break
        upstream.release()
        body += "\n".join(lines)

    events = [line.removeprefix("data: ") for line in body.splitlines() if line]
    assert answer.status_code == 200 and "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "guardrail_violation"
    assert "A long preamble" in body and SECRET[:6] not in body
    logged = gateway.wait_for_log("request")[-1]
    assert (logged["status"], logged["error"], logged["outcome"]) == \
        (400, "guardrail_violation", "error")
    whole = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10, json={
        "model": "m", "messages": [{"role": "user", "content": "the key?"}]})
    assert whole.status_code == 400 and SECRET[:6] not in whole.text
    assert whole.json()["error"]["code"] == "guardrail_violation"


def test_a_key_and_its_team_bring_their_guardrails_and_unknown_names_are_refused(
        start_gateway: Callable[..., GatewayProcess], upstream_factory: Callable[[str],
                                                                                FakeUpstream]
) -> None:
    upstream = upstream_factory("keyed")
    gateway = start_gateway(_doc(upstream))
    admin = f"{gateway.url}/admin"

    refused = httpx.post(f"{admin}/keys", json={"name": "k", "guardrails": ["nope"]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "guardrails"
    team = httpx.post(f"{admin}/teams", json={"name": "t", "guardrails": ["pii"]})
    assert team.status_code == 201 and team.json()["guardrails"] == ["pii"]
    made = httpx.post(f"{admin}/keys", json={"name": "k", "team": "t"})
    assert made.status_code == 201, made.text
    client = openai.OpenAI(base_url=gateway.base_url, api_key=made.json()["key"],
                           max_retries=0)
    upstream.set_mode(echo_prompt())

    answer = client.chat.completions.create(model="plain", messages=[
        {"role": "user", "content": "mail alice@example.com"}])

    assert answer.choices[0].message.content == "mail alice@example.com"
    assert upstream.last_json["messages"][0]["content"] == "mail [EMAIL_1]"


def test_an_alias_naming_a_guardrail_llms_json_lacks_is_a_config_error(tmp_path: Path) -> None:
    doc = config({"main": provider("http://127.0.0.1:9/v1", {"m": "m"})})
    doc["guardrails"] = {"pii": {"detect": ["email"], "action": "pseudonymize"}}
    doc["models"] = {"m": {"guardrails": ["pi"]}}
    with pytest.raises(ConfigError, match=r"models\.m\.guardrails: no guardrail named 'pi'"):
        parse(json.dumps(doc), tmp_path / "llms.json", {})
    doc["guardrails"] = {"bad": {"patterns": {"lower": "x+"}}}
    with pytest.raises(ConfigError, match=r"guardrails"):
        parse(json.dumps(doc), tmp_path / "llms.json", {})


def test_the_cache_keeps_placeholders_and_each_client_gets_its_own_value_back(
        start_gateway: Callable[..., GatewayProcess], upstream_factory: Callable[[str],
                                                                                FakeUpstream]
) -> None:
    upstream = upstream_factory("cached")
    doc = _doc(upstream, m={"guardrails": ["pii"], "cache": {"ttl": 60}})
    gateway = start_gateway(doc)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    upstream.set_mode(echo_prompt())

    first = client.chat.completions.with_raw_response.create(model="m", messages=[
        {"role": "user", "content": "mail alice@example.com"}])
    second = client.chat.completions.with_raw_response.create(model="m", messages=[
        {"role": "user", "content": "mail bob@example.org"}])

    assert first.parse().choices[0].message.content == "mail alice@example.com"
    assert second.headers.get("x-llms-cache") == "hit" and len(upstream.requests) == 1
    assert second.parse().choices[0].message.content == "mail bob@example.org"
