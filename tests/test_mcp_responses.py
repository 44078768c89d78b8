"""MCP tools for any model: a Responses request naming a gateway MCP server as an `mcp` tool,
served by a chat-completions model that cannot run MCP, gets the loop run by the gateway: the
tools listed and given to the model, the call it asks for made through the gateway's MCP hub as
the caller's key, the result fed back, and OpenAI's `mcp_list_tools` / `mcp_call` items in the
answer, whole and streamed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fake_mcp import FakeMcp
from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.test_charged_tries import charged
from tests.test_mcp_docs import block
from tests.test_teams import Admin
from tests.upstream import FakeUpstream, echo_prompt, tool_call

ADMIN_KEY = "admin-mcp-loop-0001"
PRICE = {"input": 20.0, "output": 40.0}  # dollars per million tokens
MCP_TOOL = {"type": "mcp", "server_label": "remote", "allowed_tools": ["echo"],
            "require_approval": "never"}


@pytest.fixture(scope="module")
def model() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="chat") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, model: FakeUpstream, remote: FakeMcp
            ) -> Iterator[GatewayProcess]:
    workdir = tmp_path_factory.mktemp("mcp-loop")
    doc = config({"chat": provider(model.base_url, {"kimi": {"id": "kimi-k2", "price": PRICE}})},
                 server={"admin_keys": [ADMIN_KEY]}, mcp={"max_tool_rounds": 2},
                 database={"url": f"sqlite:///{workdir / 'spend.db'}"})
    doc["mcp_servers"] = {"remote": {"url": remote.url},
                          "local": {"command": [sys.executable, "tests/mcp_stdio_server.py"]}}
    gateway = GatewayProcess(workdir, doc).start(timeout=60)
    yield gateway
    gateway.stop()


@pytest.fixture
def client(gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> openai.OpenAI:
    model.reset()
    remote.calls.clear()
    return openai.OpenAI(base_url=gateway.base_url, api_key=ADMIN_KEY, max_retries=0,
                         timeout=60)


def offered(request: Any) -> list[str]:
    """The function names a chat request gave the model."""
    return [tool["function"]["name"] for tool in request.json.get("tools") or ()]


def test_a_chat_model_calls_a_gateway_mcp_tool_and_answers_with_its_result(
        client: openai.OpenAI, model: FakeUpstream, remote: FakeMcp) -> None:
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "tide tables"})), echo_prompt())

    response = client.responses.create(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                       input="What does the echo tool say about tide tables?")

    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    listed, called = response.output[:2]
    assert listed.server_label == "remote"  # type: ignore[union-attr]
    assert [tool.name for tool in listed.tools] == ["echo"]  # type: ignore[union-attr]
    assert called.name == "echo" and called.server_label == "remote"  # type: ignore[union-attr]
    assert json.loads(called.arguments) == {"text": "tide tables"}  # type: ignore[union-attr]
    assert called.output == "echo: tide tables"  # type: ignore[union-attr]
    assert response.output_text == "echo: tide tables"
    assert remote.calls == ["echo"]
    for item in response.model_dump(mode="json", exclude_none=True)["output"]:
        validate(item, {"mcp_list_tools": "MCPListTools", "mcp_call": "MCPToolCall",
                        "message": "OutputMessage"}[item["type"]])
    first, second = (request.json for request in model.requests)
    assert [tool["function"]["name"] for tool in first["tools"]] == ["remote_echo"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1",
                                      "content": "echo: tide tables"}


def test_streamed_the_items_come_as_they_happen_in_openai_s_events(
        client: openai.OpenAI, gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp
        ) -> None:
    asking = tool_call("remote_echo", json.dumps({"text": "gulls"}))
    model.set_mode(asking, echo_prompt(), asking, echo_prompt())

    with client.responses.stream(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                 input="Echo gulls") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds.index("response.mcp_list_tools.completed") \
        < kinds.index("response.mcp_call.in_progress") \
        < kinds.index("response.mcp_call.completed") < kinds.index("response.output_text.delta")
    assert kinds[-1] == "response.completed"
    assert [item.type for item in final.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert final.output_text == "echo: gulls"
    assert remote.calls == ["echo"]
    # The same stream as it goes on the wire: every event in OpenAI's published shapes.
    body = httpx.post(f"{gateway.base_url}/responses", timeout=60,
                      headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                      json={"model": "kimi", "input": "Echo gulls", "tools": [MCP_TOOL],
                            "stream": True}).text
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        validate(event, "ResponseStreamEvent")
    assert events[-1]["response"]["output"][1]["output"] == "echo: gulls"


def test_a_key_s_allow_list_bounds_what_the_model_is_offered(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    key = Admin(gateway, ADMIN_KEY).key(name="echo-only", mcp_tools=["remote_echo"])["key"]
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=60)
    model.reset()
    remote.calls.clear()
    model.set_mode(tool_call("remote_progress", json.dumps({"steps": 1})), echo_prompt())
    everything = {"type": "mcp", "server_label": "remote", "require_approval": "never"}

    response = client.responses.create(model="kimi", tools=[everything],  # type: ignore[list-item]
                                       input="Use every tool you have")

    assert offered(model.requests[0]) == ["remote_echo"]
    assert [tool.name for tool in response.output[0].tools] == ["echo"]  # type: ignore[union-attr]
    # The model named a tool it was not offered: not an MCP call, and never made.
    assert [item.type for item in response.output] == ["mcp_list_tools", "function_call"]
    assert remote.calls == []


def test_tool_rounds_are_bounded_then_the_model_answers_without_tools(
        client: openai.OpenAI, model: FakeUpstream, remote: FakeMcp) -> None:
    asking = tool_call("remote_echo", json.dumps({"text": "again"}))
    model.set_mode(asking, asking, echo_prompt())

    response = client.responses.create(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                       input="Echo forever")

    assert [item.type for item in response.output] == \
        ["mcp_list_tools", "mcp_call", "mcp_call", "message"]
    assert len(model.requests) == 3 and model.requests[-1].json["tool_choice"] == "none"


@pytest.mark.parametrize(("tool", "param"), [
    ({"server_label": "nowhere"}, "tools[0].server_label"),
    ({"require_approval": "always"}, "tools[0].require_approval"),
])
def test_what_the_gateway_cannot_do_is_a_400_naming_the_field(
        gateway: GatewayProcess, tool: dict[str, Any], param: str) -> None:
    answer = httpx.post(f"{gateway.base_url}/responses", timeout=30,
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                        json={"model": "kimi", "input": "hi", "tools": [{**MCP_TOOL, **tool}]})

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_the_docs_snippet_runs(gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp
                               ) -> None:
    model.reset()
    remote.calls.clear()
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "tide tables"})), echo_prompt())
    snippet = block("tests/test_mcp_responses.py runs this block", "python")
    env = {**os.environ, "OPENAI_BASE_URL": gateway.base_url, "OPENAI_API_KEY": ADMIN_KEY}

    ran = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True,
                         text=True, timeout=60, check=False)

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["['mcp_list_tools', 'mcp_call', 'message']",
                                       "echo: tide tables"]
    assert remote.calls == ["echo"]


def test_a_keyed_request_s_retry_replays_the_model_s_rounds(
        client: openai.OpenAI, model: FakeUpstream, remote: FakeMcp) -> None:
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "once"})), echo_prompt())
    keyed = client.with_options(default_headers={"Idempotency-Key": "loop-retry-0001"})

    first = keyed.responses.create(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                   input="Echo once")
    again = keyed.responses.create(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                   input="Echo once")

    assert first.output_text == again.output_text == "echo: once"
    assert len(model.requests) == 2  # each round answered once, replayed to the retry


def test_a_budgeted_key_is_charged_every_round_of_the_loop(
        gateway: GatewayProcess, model: FakeUpstream, remote: FakeMcp) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    made = admin.key(name="budgeted", budget={"usd": 5.0, "period": "total"})
    client = openai.OpenAI(base_url=gateway.base_url, api_key=made["key"], max_retries=0,
                           timeout=60)
    model.reset()
    model.set_mode(tool_call("remote_echo", json.dumps({"text": "paid"})), echo_prompt())

    response = client.responses.create(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                       input="Echo paid")

    assert response.usage is not None and len(model.requests) == 2
    rounds = [request.json for request in model.requests]
    assert response.usage.input_tokens > 0
    expected = (response.usage.input_tokens * PRICE["input"]
                + response.usage.output_tokens * PRICE["output"]) / 1e6
    # Two rows: the request, and its tool call (free here: the server has no price).
    assert charged(admin, made["id"], 2) == pytest.approx(expected, rel=1e-6)
    assert rounds[0]["messages"] != rounds[1]["messages"]


def test_a_tool_that_fails_is_a_failed_mcp_call_and_the_model_is_told(
        client: openai.OpenAI, model: FakeUpstream) -> None:
    model.set_mode(tool_call("remote_echo", "{}"), echo_prompt())  # `text` is required

    response = client.responses.create(model="kimi", tools=[MCP_TOOL],  # type: ignore[list-item]
                                       input="Echo nothing")

    called = response.model_dump(mode="json", exclude_none=True, warnings=False)["output"][1]
    validate(called, "MCPToolCall")
    assert called["status"] == "failed"
    assert called["error"]["type"] == "mcp_tool_execution_error"
    told = model.requests[1].json["messages"][-1]
    assert told["role"] == "tool" and "text" in told["content"]
    assert response.output_text == told["content"]
