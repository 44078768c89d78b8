"""Anthropic's MCP connector for any model: a Messages request whose `mcp_servers` name a gateway
MCP server, served by a chat-completions model that cannot run MCP, gets the loop run by the
gateway: the server's tools given to the model as ordinary tools, the call it asks for made
through the gateway's MCP hub as the caller's key, the result fed back, and Anthropic's
`mcp_tool_use` / `mcp_tool_result` blocks in the answer, whole and streamed, read by the
Anthropic SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pydantic
import pytest
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config, provider
from tests.test_mcp_docs import block
from tests.test_teams import Admin
from tests.upstream import FakeUpstream, echo_prompt, tool_call

ADMIN_KEY = "admin-mcp-messages-01"
CLIENT_TOKEN = "client-mcp-token-4242"  # what a client may put in `authorization_token`
BETAS = ["mcp-client-2025-11-20"]
EVENTS = pydantic.TypeAdapter(BetaRawMessageStreamEvent)


@pytest.fixture(scope="module")
def model() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="chat") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, model: FakeUpstream, remote: FakeMcp,
            other: FakeMcp) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("mcp-messages")
    doc = config({"chat": provider(model.base_url, {"kimi": "kimi-k2"})},
                 server={"admin_keys": [ADMIN_KEY]}, mcp={"max_tool_rounds": 2},
                 database={"url": f"sqlite:///{workdir / 'keys.db'}"})
    doc["mcp_servers"] = {"remote": {"url": remote.url}, "other": {"url": other.url}}
    gateway = GatewayProcess(workdir, doc).start(timeout=60)
    yield gateway
    gateway.stop()


OPENED: list[anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def fresh(model: FakeUpstream, remote: FakeMcp) -> Iterator[None]:
    model.reset()
    remote.calls.clear()
    remote.headers_seen.clear()
    yield
    while OPENED:  # a client left to the garbage collector leaves its socket unclosed
        OPENED.pop().close()


def client(gateway: GatewayProcess, key: str = ADMIN_KEY) -> anthropic.Anthropic:
    OPENED.append(anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0,
                                      timeout=60))
    return OPENED[-1]


def servers(gateway: GatewayProcess, name: str = "remote") -> list[dict[str, Any]]:
    """`mcp_servers` naming the gateway's own `/mcp/{name}`, with a token of the client's."""
    return [{"type": "url", "url": f"{gateway.url}/mcp/{name}", "name": name,
             "authorization_token": CLIENT_TOKEN}]


ECHO_ONLY = [{"type": "mcp_toolset", "mcp_server_name": "remote",
              "default_config": {"enabled": False}, "configs": {"echo": {"enabled": True}}}]


def offered(request: Any) -> list[str]:
    """The function names a chat request gave the model."""
    return [tool["function"]["name"] for tool in request.json.get("tools") or ()]


def test_a_chat_model_calls_a_gateway_mcp_tool_and_answers_with_anthropic_s_blocks(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "tide tables"})), echo_prompt())
    ask = [{"role": "user", "content": "What does the echo tool say about tide tables?"}]

    raw = client(gateway).beta.messages.with_raw_response.create(
        model="kimi", max_tokens=256, messages=ask,  # type: ignore[arg-type]
        mcp_servers=servers(gateway), tools=ECHO_ONLY, betas=BETAS)  # type: ignore[arg-type]
    message = raw.parse()

    assert [block.type for block in message.content] == \
        ["mcp_tool_use", "mcp_tool_result", "text"]
    used, result, said = message.content
    assert (used.name, used.server_name, used.input) == \
        ("echo", "remote", {"text": "tide tables"})  # type: ignore[union-attr]
    assert result.tool_use_id == used.id and result.is_error is False  # type: ignore[union-attr]
    assert [part.text for part in result.content] == ["echo: tide tables"]  # type: ignore
    assert said.text == "echo: tide tables"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.model == "kimi"
    BetaMessage.model_validate(json.loads(raw.http_response.text), strict=True)
    assert remote.calls == ["echo"]
    first, second = model.requests
    assert offered(first) == ["remote_echo"]
    assert second.json["messages"][-1] == {"role": "tool", "tool_call_id": "call_1",
                                           "content": "echo: tide tables"}

    # The conversation goes on: the blocks sent back are the tool turns the model made.
    model.reset()
    model.set_mode(echo_prompt())
    again = client(gateway).beta.messages.create(
        model="kimi", max_tokens=256, betas=BETAS, mcp_servers=servers(gateway),  # type: ignore
        tools=ECHO_ONLY, messages=[*ask, {"role": "assistant", "content": message.content},
                                   {"role": "user", "content": "Thanks"}])  # type: ignore
    assert [block.type for block in again.content] == ["text"]
    sent = model.requests[0].json["messages"]
    assert [turn["role"] for turn in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "remote_echo"
    assert sent[2] == {"role": "tool", "tool_call_id": used.id, "content": "echo: tide tables"}


def test_streamed_the_blocks_come_as_anthropic_streams_them(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    asking = tool_call("remote_echo", json.dumps({"text": "gulls"}))
    model.set_mode(asking, echo_prompt(), asking, echo_prompt())
    ask = [{"role": "user", "content": "Echo gulls"}]

    with client(gateway).beta.messages.stream(
            model="kimi", max_tokens=256, messages=ask,  # type: ignore[arg-type]
            mcp_servers=servers(gateway), tools=ECHO_ONLY, betas=BETAS) as stream:  # type: ignore
        kinds = [(event.type, getattr(getattr(event, "content_block", None), "type", None))
                 for event in stream]
        final = stream.get_final_message()

    assert kinds[0] == ("message_start", None) and kinds[-1] == ("message_stop", None)
    assert kinds.index(("content_block_start", "mcp_tool_use")) \
        < kinds.index(("content_block_start", "mcp_tool_result")) \
        < kinds.index(("content_block_start", "text"))
    assert [block.type for block in final.content] == ["mcp_tool_use", "mcp_tool_result", "text"]
    assert final.content[0].input == {"text": "gulls"}  # type: ignore[union-attr]
    assert final.content[2].text == "echo: gulls"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    assert remote.calls == ["echo"]
    # The same stream as it goes on the wire: every event in Anthropic's published shapes.
    with httpx.stream("POST", f"{gateway.base_url}/messages?beta=true", timeout=60,
                      headers={"x-api-key": ADMIN_KEY, "anthropic-version": "2023-06-01",
                               "anthropic-beta": BETAS[0]},
                      json={"model": "kimi", "max_tokens": 256, "messages": ask,
                            "mcp_servers": servers(gateway), "tools": ECHO_ONLY,
                            "stream": True}) as answer:
        text = answer.read().decode()
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    assert events[1] == {"type": "ping"}  # as Anthropic sends it, outside the event types
    for event in events[:1] + events[2:]:
        EVENTS.validate_python(event, strict=True)
    starts = [event["index"] for event in events if event["type"] == "content_block_start"]
    assert starts == [0, 1, 2]


def test_a_key_s_allow_list_bounds_the_tools_and_a_server_it_may_not_use_is_unknown(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    key = Admin(gateway, ADMIN_KEY).key(name="echo-only", mcp_tools=["remote_echo"])["key"]
    model.set_mode(tool_call("remote_progress", json.dumps({"steps": 1})), echo_prompt())
    ask = [{"role": "user", "content": "Use every tool you have"}]

    message = client(gateway, key).beta.messages.create(
        model="kimi", max_tokens=256, messages=ask,  # type: ignore[arg-type]
        mcp_servers=servers(gateway), betas=BETAS)  # type: ignore[arg-type]

    assert offered(model.requests[0]) == ["remote_echo"]
    # The model named a tool it was not offered: an ordinary tool_use, and never made.
    assert [block.type for block in message.content] == ["tool_use"]
    assert remote.calls == []

    def refused(name: str) -> dict[str, Any]:
        with pytest.raises(anthropic.BadRequestError) as caught:
            client(gateway, key).beta.messages.create(
                model="kimi", max_tokens=256, messages=ask,  # type: ignore[arg-type]
                mcp_servers=servers(gateway, name), betas=BETAS)  # type: ignore[arg-type]
        return caught.value.body  # type: ignore[return-value]

    denied, unknown = refused("other"), refused("ghost")
    assert json.dumps(denied).replace("other", "NAME") == \
        json.dumps(unknown).replace("ghost", "NAME")
    assert denied["error"]["type"] == "invalid_request_error"
    assert "mcp_servers[0].name" in denied["error"]["message"]


def test_the_upstream_never_sees_the_client_s_key_nor_its_token(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "secret?"})), echo_prompt())
    old_style = [{**servers(gateway)[0], "tool_configuration": {"allowed_tools": ["echo"]}}]

    client(gateway).beta.messages.create(
        model="kimi", max_tokens=256, betas=["mcp-client-2025-04-04"],
        messages=[{"role": "user", "content": "Echo"}],
        mcp_servers=old_style)  # type: ignore[arg-type]

    assert remote.calls == ["echo"] and offered(model.requests[0]) == ["remote_echo"]
    seen = json.dumps(remote.headers_seen)
    assert remote.headers_seen and ADMIN_KEY not in seen and CLIENT_TOKEN not in seen
    assert CLIENT_TOKEN not in json.dumps([request.json for request in model.requests])


def test_rounds_are_bounded_then_the_model_answers_without_tools(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    asking = tool_call("remote_echo", json.dumps({"text": "again"}))
    model.set_mode(asking, asking, echo_prompt())

    message = client(gateway).beta.messages.create(
        model="kimi", max_tokens=256, messages=[{"role": "user", "content": "Echo forever"}],
        mcp_servers=servers(gateway), tools=ECHO_ONLY, betas=BETAS)  # type: ignore[arg-type]

    assert [block.type for block in message.content] == \
        ["mcp_tool_use", "mcp_tool_result", "mcp_tool_use", "mcp_tool_result", "text"]
    assert len(model.requests) == 3 and model.requests[-1].json["tool_choice"] == "none"


@pytest.mark.parametrize(("change", "param"), [
    ({"tools": [{**ECHO_ONLY[0], "mcp_server_name": "elsewhere"}]}, "tools[0].mcp_server_name"),
    ({"mcp_servers": [{"type": "url", "url": "https://example.com/mcp", "name": "nowhere"}]},
     "mcp_servers[0].name"),
])
def test_what_the_gateway_cannot_serve_is_a_400_naming_the_field(
        gateway: GatewayProcess, change: dict[str, Any], param: str) -> None:
    body = {"model": "kimi", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
            "mcp_servers": servers(gateway), **change}

    answer = httpx.post(f"{gateway.base_url}/messages", json=body, timeout=30,
                        headers={"x-api-key": ADMIN_KEY, "anthropic-version": "2023-06-01"})

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(param)


def test_the_docs_snippet_runs(gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp
                               ) -> None:
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "tide tables"})), echo_prompt())
    snippet = block("tests/test_mcp_messages.py runs this block", "python")
    env = {**os.environ, "ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": ADMIN_KEY}

    ran = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True,
                         text=True, timeout=60, check=False)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["['mcp_tool_use', 'mcp_tool_result', 'text']",
                                       "echo: tide tables"]
    assert remote.calls == ["echo"]


def test_under_the_newest_connector_the_answer_tells_what_it_listed_and_a_pinned_listing_holds(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "pinned"})), echo_prompt())
    pinned = [{"type": "mcp_toolset", "mcp_server_name": "remote",
               "tools": [{"name": "echo", "input_schema": {"type": "object"}}]}]
    ask = [{"role": "user", "content": "Echo pinned"}]

    raw = client(gateway).beta.messages.with_raw_response.create(
        model="kimi", max_tokens=256, messages=ask,  # type: ignore[arg-type]
        mcp_servers=servers(gateway), tools=pinned,  # type: ignore[arg-type]
        betas=["mcp-client-2026-09-15"])
    message = raw.parse()

    assert [block.type for block in message.content] == \
        ["mcp_tool_listing", "mcp_tool_use", "mcp_tool_result", "text"]
    listing = message.content[0]
    assert listing.mcp_server_name == "remote"  # type: ignore[union-attr]
    assert [tool.name for tool in listing.tools] == ["echo"]  # type: ignore[union-attr]
    assert offered(model.requests[0]) == ["remote_echo"]
    BetaMessage.model_validate(json.loads(raw.http_response.text), strict=True)

    # Sent back unchanged, as Anthropic asks: the model never sees the listing.
    model.reset()
    client(gateway).beta.messages.create(
        model="kimi", max_tokens=256, mcp_servers=servers(gateway),  # type: ignore[arg-type]
        tools=pinned, betas=["mcp-client-2026-09-15"],  # type: ignore[arg-type]
        messages=[*ask, {"role": "assistant", "content": message.content},  # type: ignore
                  {"role": "user", "content": "Thanks"}])
    assert [turn["role"] for turn in model.requests[0].json["messages"]] == \
        ["user", "assistant", "tool", "assistant", "user"]
