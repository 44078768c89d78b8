"""Client betas on the operator's Anthropic key: only those the operator lists go upstream.

An `anthropic-beta` header switches features on (and bills them) on whatever key sends it: the
gateway's. A provider forwards the client betas its `betas` list names and drops the rest (the
request is still served); and since a beta changes what the same body answers, the response
cache's key holds the betas that go upstream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from gateway.cache.store import key_of
from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from providers.contract.provider import Outgoing
from providers.kinds.anthropic import AnthropicProvider
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config
from tests.test_resume_seam import _NoTransport

CACHING, PREMIUM = "prompt-caching-2024-07-31", "some-premium-feature-2025-09-01"
CONTEXT = "context-management-2025-06-27"
BODY = {"max_tokens": 64, "messages": [{"role": "user", "content": "Summarise the report"}]}


@pytest.fixture(scope="module")
def claude() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(name="claude") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            claude: FakeAnthropic) -> Iterator[GatewayProcess]:
    base = claude.base_url.removesuffix("/v1")
    doc = config({
        "listed": {"type": "anthropic", "base_url": base, "api_key": "sk-ant-listed-0001",
                   "models": {"claude": "claude-sonnet-4-5"},
                   "betas": [CACHING, "context-management-*"]},
        "unlisted": {"type": "anthropic", "base_url": base, "api_key": "sk-ant-unlisted-01",
                     "models": {"plain-claude": "claude-sonnet-4-5"}},
    }, defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("betas"), doc).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def fresh(claude: FakeAnthropic) -> None:
    claude.reset()


def messages(gateway: GatewayProcess, model: str, betas: str | None) -> httpx.Response:
    headers = {"anthropic-version": "2023-06-01"}
    if betas is not None:
        headers["anthropic-beta"] = betas
    return httpx.post(f"{gateway.base_url}/messages", headers=headers, timeout=10,
                      json={"model": model, **BODY})


def test_only_the_betas_the_operator_lists_reach_anthropic(
        gateway: GatewayProcess, claude: FakeAnthropic) -> None:
    answer = messages(gateway, "claude", f"{CACHING}, {PREMIUM},{CONTEXT}")

    assert answer.status_code == 200, "an unlisted beta is dropped, not refused"
    assert claude.requests[-1].headers["anthropic-beta"] == f"{CACHING},{CONTEXT}"


def test_a_provider_that_lists_no_beta_forwards_none(
        gateway: GatewayProcess, claude: FakeAnthropic) -> None:
    answer = messages(gateway, "plain-claude", f"{CACHING},{PREMIUM}")

    assert answer.status_code == 200, answer.text
    assert "anthropic-beta" not in claude.requests[-1].headers


def test_a_beta_that_needs_a_field_refused_upstream_when_the_operator_does_not_list_it(
        gateway: GatewayProcess, claude: FakeAnthropic) -> None:
    body = {"model": "plain-claude", **BODY, "context_management": {"edits": []}}
    answer = httpx.post(f"{gateway.base_url}/messages", json=body, timeout=10,
                        headers={"anthropic-beta": CONTEXT})

    assert answer.status_code == 400, "Anthropic refuses the field its beta would enable"
    assert "context_management" in answer.json()["error"]["message"]


def test_the_cache_keys_answers_by_the_betas_that_go_upstream(tmp_path: Path) -> None:
    """The cached endpoints (chat, completions) send no client beta upstream today; a beta
    that does go upstream keys the answer, so one made with it is never one made without."""
    snapshot = parse(json.dumps({"providers": {"claude": {
        "type": "anthropic", "api_key": "k", "models": {"c": "c"},
        "betas": [CACHING, "context-management-*"]}}}), tmp_path / "llms.json", {})
    claude = AnthropicProvider(snapshot.providers[0], _NoTransport())  # type: ignore[arg-type]
    asked = Outgoing("messages", b"{}", "c", False, "r", betas=f"{PREMIUM},{CONTEXT}")
    body = {"model": "c", "messages": []}

    assert claude.forwarded_betas(asked) == [CONTEXT]
    assert claude.forwarded_betas(replace(asked, endpoint="chat/completions")) == []
    assert key_of("messages", "c", body, None, [CONTEXT]) != key_of("messages", "c", body, None)
    assert key_of("messages", "c", body, None, []) == key_of("messages", "c", body, None)


@pytest.mark.parametrize("betas", [["a,b"], [""], [" spaced"], "prompt-caching"])
def test_a_betas_list_that_names_no_beta_is_a_config_error(
        tmp_path: Path, betas: object) -> None:
    text = json.dumps({"providers": {"claude": {
        "type": "anthropic", "api_key": "k", "models": {"c": "c"}, "betas": betas}}})

    with pytest.raises(ConfigError, match=r"providers\.claude"):
        parse(text, tmp_path / "llms.json", {})
