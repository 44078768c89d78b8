"""Guardrails: a team's users' personal data and secrets never reach the provider, the users read
their own values back, whole or streamed, and what policy forbids is stopped.

One gateway, its aliases each behind a guardrail of llms.json, one fake upstream that records
what it was sent and can echo a prompt back split across two deltas at any position.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI

from tests import browser
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, echo_prompt, ok, tool_call

EMAIL, PHONE = "alice@example.com", "+1 415 555 2671"
CARD, NOT_A_CARD = "4111 1111 1111 1111", "4111 1111 1111 1112"
SECRET = "sk-proj-Zq8d7Xc2Vb9Nm4Lk1Jh6Gf3Ds5Aa0Pp"
GUARDRAILS = {
    "pii": {"detect": ["email", "phone"], "action": "pseudonymize"},
    "cards": {"detect": ["card"], "action": "block", "phases": ["input"]},
    "no-secrets": {"detect": ["secrets"], "action": "block"},
    "masked": {"detect": ["email"], "action": "mask"},
}
ALIASES = {"pii-model": ["pii"], "card-model": ["cards"], "secret-model": ["no-secrets"],
           "mask-model": ["masked"], "plain-model": []}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="guarded") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream
            ) -> Iterator[GatewayProcess]:
    doc = config({"main": provider(upstream.base_url, {alias: alias for alias in ALIASES})},
                 defaults={"circuit": {"enabled": False}})
    doc["guardrails"] = GUARDRAILS
    doc["models"] = {alias: {"guardrails": names} for alias, names in ALIASES.items() if names}
    process = GatewayProcess(tmp_path_factory.mktemp("guardrails"), doc)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client(gateway: GatewayProcess, upstream: FakeUpstream) -> openai.OpenAI:
    upstream.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def _sent(upstream: FakeUpstream) -> str:
    """What the provider was sent, as text."""
    return upstream.requests[-1].body.decode()


def test_the_provider_sees_placeholders_while_the_openai_client_reads_its_own_values(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.set_mode(echo_prompt())
    prompt = f"Mail {EMAIL} or call {PHONE}; {EMAIL} again."

    whole = client.chat.completions.with_raw_response.create(
        model="pii-model", messages=[{"role": "user", "content": prompt}])

    assert upstream.last_json["messages"][0]["content"] == \
        "Mail [EMAIL_1] or call [PHONE_1]; [EMAIL_1] again."
    assert EMAIL not in _sent(upstream) and PHONE not in _sent(upstream)
    assert whole.parse().choices[0].message.content == prompt
    assert whole.headers["x-llms-guardrails"] == "pseudonymize:pii=3"
    streamed = client.chat.completions.create(
        model="pii-model", messages=[{"role": "user", "content": prompt}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == prompt
    assert EMAIL not in _sent(upstream)


def test_a_placeholder_split_across_two_deltas_at_every_position_comes_back_whole(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    prompt = f"To {EMAIL}."
    seen = "To [EMAIL_1]."
    for split_at in range(len(seen) + 1):
        upstream.set_mode(echo_prompt(split_at))
        streamed = client.chat.completions.create(
            model="pii-model", messages=[{"role": "user", "content": prompt}], stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == prompt, split_at
        assert upstream.last_json["messages"][0]["content"] == seen


def test_the_anthropic_sdk_reads_its_values_back_whole_and_streamed(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    upstream.reset()
    claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
    prompt = f"Call {PHONE} about {EMAIL}"
    for split_at in (4, 9, 14, 20):
        upstream.set_mode(echo_prompt(split_at))
        with claude.messages.stream(model="pii-model", max_tokens=64,
                                    messages=[{"role": "user", "content": prompt}]) as stream:
            assert "".join(stream.text_stream) == prompt
        assert "[PHONE_1]" in _sent(upstream) and PHONE not in _sent(upstream)
    upstream.set_mode(echo_prompt())
    whole = claude.messages.create(model="pii-model", max_tokens=64,
                                   messages=[{"role": "user", "content": prompt}])
    assert whole.content[0].text == prompt  # type: ignore[union-attr]


def test_langchain_reads_its_values_back(gateway: GatewayProcess, upstream: FakeUpstream
                                         ) -> None:
    upstream.reset()
    upstream.set_mode(echo_prompt(7))
    chat = ChatOpenAI(model="pii-model", base_url=gateway.base_url, api_key="unused",
                      max_retries=0)

    assert chat.invoke(f"Write to {EMAIL}").content == f"Write to {EMAIL}"
    assert "".join(str(c.content) for c in chat.stream(f"Write to {EMAIL}")) == \
        f"Write to {EMAIL}"
    assert "[EMAIL_1]" in _sent(upstream) and EMAIL not in _sent(upstream)


def test_a_tool_call_s_arguments_are_given_back_and_one_value_is_one_placeholder(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.set_mode(tool_call("send_mail", '{"to": "[EMAIL_1]", "cc": "[EMAIL_2]"}'))
    messages: list[Any] = [
        {"role": "user", "content": f"Mail {EMAIL}, copy bob@example.org"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c0", "type": "function",
             "function": {"name": "lookup", "arguments": json.dumps({"who": EMAIL})}}]},
        {"role": "tool", "tool_call_id": "c0", "content": f"{EMAIL} is Alice"}]
    tools: Any = [{"type": "function", "function": {"name": "send_mail", "parameters": {}}}]

    whole = client.chat.completions.create(model="pii-model", messages=messages, tools=tools)

    sent = upstream.last_json["messages"]
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"who": "[EMAIL_1]"}
    assert sent[2]["content"] == "[EMAIL_1] is Alice" and "bob@" not in _sent(upstream)
    call = whole.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(call.function.arguments) == {"to": EMAIL, "cc": "bob@example.org"}
    streamed = client.chat.completions.create(model="pii-model", messages=messages,
                                              tools=tools, stream=True)
    arguments = "".join(c.choices[0].delta.tool_calls[0].function.arguments or ""
                        for c in streamed if c.choices and c.choices[0].delta.tool_calls)
    assert json.loads(arguments) == {"to": EMAIL, "cc": "bob@example.org"}


def test_a_valid_card_is_blocked_and_a_luhn_invalid_number_passes(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.set_mode(ok("noted"))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="card-model", messages=[
            {"role": "user", "content": f"my card is {CARD}"}])
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "guardrail_violation"
    assert "'cards'" in error["message"] and "CARD" in error["message"]
    assert "4111" not in error["message"] and upstream.requests == []
    assert refused.value.response.headers["x-llms-guardrails"] == "block:cards"

    passed = client.chat.completions.create(model="card-model", messages=[
        {"role": "user", "content": f"not a card: {NOT_A_CARD}"}])
    assert passed.choices[0].message.content == "noted"
    assert NOT_A_CARD in _sent(upstream)


def test_a_secret_is_blocked_in_each_dialect_and_kept_nowhere(
        gateway: GatewayProcess, client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.set_mode(ok("noted"))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="secret-model", messages=[
            {"role": "user", "content": f"deploy with {SECRET}"}], stream=True)
    assert refused.value.body["code"] == "guardrail_violation"  # type: ignore[index]
    assert "SECRET" in refused.value.body["message"]  # type: ignore[index]

    answer = httpx.post(f"{gateway.base_url}/messages", json={
        "model": "secret-model", "max_tokens": 16,
        "messages": [{"role": "user", "content": f"key: {SECRET}"}]}, timeout=10)
    assert answer.status_code == 400 and answer.json()["type"] == "error"
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert "'no-secrets'" in answer.json()["error"]["message"]
    assert upstream.requests == []
    gateway.wait_for_log("request", 2)
    lines = [line for line in gateway.log_events("request")
             if line.get("model") == "secret-model"]
    assert lines and all(line["error"] == "guardrail_violation" for line in lines)
    assert all(line["guardrails"] == "block:no-secrets" for line in lines)
    assert _nowhere(SECRET[8:], gateway)
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    assert 'llms_guardrail_actions_total{action="block",category="SECRET",' \
           'guardrail="no-secrets"} 2.0' in metrics


def _nowhere(text: str, gateway: GatewayProcess) -> bool:
    """`text` in no log line, no status page and no file the gateway wrote (its database)."""
    surfaces = [gateway.logs(), httpx.get(f"{gateway.url}/status.json", timeout=5).text]
    for path in Path(gateway.workdir).rglob("*"):
        if path.is_file() and path.name != "llms.json":
            surfaces.append(path.read_bytes().decode("utf-8", "replace"))
    return all(text not in surface for surface in surfaces)


def test_mask_is_irreversible(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.set_mode(echo_prompt(3))
    streamed = client.chat.completions.create(model="mask-model", stream=True, messages=[
        {"role": "user", "content": f"Mail {EMAIL}"}])
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        "Mail [EMAIL]"
    assert upstream.last_json["messages"][0]["content"] == "Mail [EMAIL]"


def test_status_json_lists_the_guardrails_and_what_they_did(
        gateway: GatewayProcess, client: openai.OpenAI, upstream: FakeUpstream) -> None:
    upstream.set_mode(echo_prompt())
    client.chat.completions.create(model="pii-model", messages=[
        {"role": "user", "content": f"Mail {EMAIL}"}])
    section = {g["name"]: g for g in
               httpx.get(f"{gateway.url}/status.json", timeout=5).json()["guardrails"]}
    assert section["pii"]["action"] == "pseudonymize"
    assert section["pii"]["aliases"] == ["pii-model"]
    assert section["pii"]["actions"]["pseudonymize:EMAIL"] >= 1


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_the_status_page_shows_each_guardrail_and_what_it_did(
        gateway: GatewayProcess, client: openai.OpenAI, upstream: FakeUpstream,
        tmp_path: Path) -> None:
    upstream.set_mode(echo_prompt())
    client.chat.completions.create(model="pii-model", messages=[
        {"role": "user", "content": f"Mail {EMAIL}"}])

    with browser.launched(tmp_path) as port:
        shown = asyncio.run(_guardrails_panel(gateway.url, port))

    assert shown["names"] == list(GUARDRAILS)
    pii = shown["texts"][0]
    assert "pseudonymize on input and output" in pii and "email, phone" in pii
    assert "on pii-model" in pii and "pseudonymize:EMAIL" in pii
    assert EMAIL not in " ".join(shown["texts"])


async def _guardrails_panel(url: str, port: int) -> dict[str, Any]:
    async with browser.open_page(port) as page:
        await page.goto(f"{url}/")
        await page.wait_for("document.body.dataset.loaded === 'true'")
        return {"names": await page.evaluate(
                    "[...document.querySelectorAll('#guardrails li')].map(li => li.dataset.name)"),
                "texts": await page.evaluate(
                    "[...document.querySelectorAll('#guardrails li')].map(li => li.textContent)")}
