"""Claude Code, the CLI from npm, through the gateway to a provider of each kind.

`claude -p` runs a tool (Bash `echo`) and answers through a chat provider (the Messages bridge)
and through a native Anthropic one (the body and its betas relayed as they came), streamed (its
default) and whole (what it asks again when a stream breaks). The CLI is pinned in tests/node
and installed by `make test`; those stories are skipped when it is not there. The others read two
requests Claude Code really sent (tests/data/claude-code-requests.json, trimmed) and what newer
Messages requests hold: blocks, roles and fields the gateway's translation must place or leave.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core.messages import MessagesRequest, to_chat
from gateway.core.schemas import parse
from providers.contract.errors import InvalidRequest
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import ROOT, GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, Recorded, ok, stream_cut, tool_call

CLI = ROOT / "tests" / "node" / "node_modules" / ".bin" / "claude"
KEY = "team-key-000001"
CHAT, NATIVE = "team-kimi", "team-claude"  # aliases Claude Code does not know, as users name them
ECHO = json.dumps({"command": "echo hi-from-bash", "description": "Print a greeting"})
FINAL = "The command printed hi-from-bash."
REQUESTS = json.loads((ROOT / "tests" / "data" / "claude-code-requests.json").read_text())
# What Claude Code 2.1.332 sent in `anthropic-beta` with those requests.
BETAS = ("claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
         "mid-conversation-tool-changes-2026-07-01,thinking-token-count-2026-05-13,"
         "advanced-tool-use-2025-11-20,effort-2025-11-24")


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed CLI, or a skip saying how to get it."""
    if not CLI.exists():
        pytest.skip("Claude Code is not installed: `make test` installs it with npm "
                    "into tests/node")
    home = str(tmp_path_factory.mktemp("claude-home"))
    try:
        subprocess.run([CLI, "--version"], capture_output=True, timeout=60, check=True,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
                            "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"})
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"Claude Code does not run here: {exc}")
    return CLI


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    with FakeUpstream(name="chat") as chat, FakeAnthropic(name="claude") as claude:
        yield {CHAT: chat, NATIVE: claude}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    doc = config({
        "claude": {"type": "anthropic", "base_url": fakes[NATIVE].base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000", "models": {NATIVE: "claude-sonnet-4-5"},
                   # The operator lets Claude Code's betas through (none pass unless listed).
                   "betas": BETAS.split(",")},
        "chat": provider(fakes[CHAT].base_url, {CHAT: "kimi-k2"}),
    }, defaults={"circuit": {"enabled": False}}, server={"api_keys": [KEY]},
        # Claude Code's own names, whatever this release calls its models.
        models={"claude-*": {"alias_of": CHAT}})
    process = GatewayProcess(tmp_path_factory.mktemp("claude-code"), doc).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> None:
    for fake in fakes.values():
        fake.reset()


def claude(cli: Path, gateway: GatewayProcess, alias: str | None, home: Path
           ) -> dict[str, Any]:
    """`claude -p` in print mode against the gateway, Bash `echo` allowed; its JSON result.
    With no alias, Claude Code asks for the models it names itself."""
    project = home / "project"
    project.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "CLAUDE_CONFIG_DIR": str(home / ".claude"),
           "ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": KEY,
           **({"ANTHROPIC_MODEL": alias, "ANTHROPIC_SMALL_FAST_MODEL": alias,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": alias} if alias else {}),
           # Nothing but the gateway: no telemetry, error reports, updates or side requests,
           # and no retries of its own (a failure shows as one).
           "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}
    done = subprocess.run(
        [cli, "-p", "Run echo hi-from-bash", "--output-format", "json",
         "--allowedTools", "Bash(echo:*)"],
        env=env, cwd=project, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{gateway.logs()[-2000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def whole_answers(gateway: GatewayProcess, alias: str) -> int:
    """How many Messages requests for `alias` the gateway answered whole, by its log."""
    return sum(1 for e in gateway.log_events("request")
               if (e.get("endpoint"), e.get("model"), e.get("status"), e.get("stream"))
               == ("messages", alias, 200, False))


def tool_output(request: Recorded) -> str:
    """What the tool printed, as the upstream got it: a `tool` message or a `tool_result`."""
    for message in request.json["messages"]:
        if message["role"] == "tool":
            return str(message["content"])
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block["type"] == "tool_result":
                return json.dumps(block["content"])
    return ""


def test_claude_code_s_own_model_names_reach_an_alias_through_a_pattern(
        cli: Path, gateway: GatewayProcess, fakes: dict[str, FakeUpstream],
        tmp_path: Path) -> None:
    fakes[CHAT].set_mode(tool_call("Bash", ECHO), ok(FINAL))
    before = len(gateway.log_events("request"))

    def asked() -> list[dict[str, Any]]:
        return [e for e in gateway.log_events("request")[before:]
                if e.get("endpoint") == "messages"]

    result = claude(cli, gateway, None, tmp_path)

    assert (result["result"], result["is_error"]) == (FINAL, False)
    wait_until(lambda: len(asked()) >= len(fakes[CHAT].requests))
    assert asked() and all(e["model"].startswith("claude-") for e in asked())
    assert {e.get("alias") for e in asked()} == {CHAT}
    assert {r.json["model"] for r in fakes[CHAT].requests} == {"kimi-k2"}


@pytest.mark.parametrize("alias", [CHAT, NATIVE])
def test_claude_code_runs_a_tool_and_answers_through_the_gateway(
        cli: Path, gateway: GatewayProcess, fakes: dict[str, FakeUpstream], alias: str,
        tmp_path: Path) -> None:
    upstream = fakes[alias]
    upstream.set_mode(tool_call("Bash", ECHO), ok(FINAL))

    result = claude(cli, gateway, alias, tmp_path)

    assert (result["result"], result["is_error"]) == (FINAL, False)
    first, second = upstream.requests
    assert first.json["stream"] is True and second.json["stream"] is True
    assert "hi-from-bash" in tool_output(second), "the upstream saw what Bash printed"
    if alias == NATIVE:  # relayed as Claude Code wrote it, with the betas that make it valid
        assert {"context_management", "thinking", "metadata"} <= set(first.json)
        assert "context-management-" in first.headers["anthropic-beta"]


@pytest.mark.parametrize("alias", [CHAT, NATIVE])
def test_a_broken_stream_makes_claude_code_ask_whole_and_the_gateway_answers_whole(
        cli: Path, gateway: GatewayProcess, fakes: dict[str, FakeUpstream], alias: str,
        tmp_path: Path) -> None:
    upstream = fakes[alias]
    upstream.set_mode(stream_cut(1, whole=tool_call("Bash", ECHO)),
                      stream_cut(1, whole=tool_call("Bash", ECHO)),
                      stream_cut(1, whole=ok(FINAL)))
    before = whole_answers(gateway, alias)

    result = claude(cli, gateway, alias, tmp_path)

    assert (result["result"], result["is_error"]) == (FINAL, False)
    asked = [bool(request.json.get("stream")) for request in upstream.requests]
    assert asked == [True, False, True, False], "each turn asked again whole after the cut"
    assert "hi-from-bash" in tool_output(upstream.requests[-1])
    wait_until(lambda: whole_answers(gateway, alias) == before + 2)


# -- what Claude Code sends, without the CLI ----------------------------------------------------


@pytest.mark.parametrize("body", REQUESTS, ids=["first", "after-the-tool"])
def test_claude_code_s_requests_pass_the_head_and_translate_in_order(
        body: dict[str, Any]) -> None:
    head, _ = parse(json.dumps(body).encode(), MessagesRequest)
    chat = to_chat(body)

    assert (head.model, head.stream, head.max_tokens) == (NATIVE, True, 32000)
    roles = [message["role"] for message in chat["messages"]]
    assert roles[:3] == ["system", "user", "system"], "a system message stays where it stood"
    assert chat["messages"][0]["content"].startswith("x-anthropic-billing-header")
    assert chat["messages"][2]["content"].startswith("# Environment")
    names = [tool["function"]["name"] for tool in chat["tools"]]
    assert "Bash" in names and "DeferredToolPlaceholder" not in names, \
        "a deferred tool is declared once a tool search loads it"
    assert chat["reasoning_effort"] == "high"  # adaptive thinking at output_config's effort
    assert chat["user"] == body["metadata"]["user_id"]
    assert "context_management" not in chat and "output_config" not in chat


def test_after_the_tool_the_chat_provider_gets_the_call_and_its_result() -> None:
    chat = to_chat(REQUESTS[1])

    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system", "assistant",
                                                     "tool"]
    call = chat["messages"][3]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == ("toolu_1", "Bash")
    assert chat["messages"][4] == {"role": "tool", "tool_call_id": "toolu_1",
                                   "content": "hi-from-bash"}


@pytest.mark.parametrize("alias", [CHAT, NATIVE])
@pytest.mark.parametrize("stream", [False, True])
def test_claude_code_s_requests_are_answered_by_either_kind(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], alias: str,
        stream: bool) -> None:
    for body in REQUESTS:
        sent = {**body, "model": alias, "stream": stream}
        answer = httpx.post(f"{gateway.base_url}/messages", json=sent,
                            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                                     "anthropic-beta": BETAS})
        assert answer.status_code == 200, answer.text
        assert ("message_stop" in answer.text) if stream else answer.json()["type"] == "message"
        if alias == NATIVE:
            got = fakes[NATIVE].requests[-1]
            assert got.json == {**sent, "model": "claude-sonnet-4-5"}, "untouched"
            assert got.headers["anthropic-beta"] == BETAS


def test_the_configured_betas_and_the_client_s_both_reach_anthropic(
        tmp_path: Path, fakes: dict[str, FakeUpstream]) -> None:
    doc = config({"claude": {
        "type": "anthropic", "base_url": fakes[NATIVE].base_url.removesuffix("/v1"),
        "api_key": "an-key-000000", "models": {NATIVE: "claude-sonnet-4-5"},
        "headers": {"Anthropic-Beta": "files-api-2025-04-14,context-management-2025-06-27"},
        "betas": ["claude-code-*", "interleaved-thinking-*", "context-management-*",
                  "mid-conversation-tool-changes-*", "thinking-token-count-*",
                  "advanced-tool-use-*", "effort-*", "files-api-*"]}})
    gateway = GatewayProcess(tmp_path, doc).start()
    try:
        body = {**REQUESTS[0], "stream": False}
        answer = httpx.post(f"{gateway.base_url}/messages", json=body,
                            headers={"anthropic-beta": BETAS})
        plain = httpx.post(f"{gateway.base_url}/chat/completions", headers={
            "anthropic-beta": "files-api-2025-04-14"}, json={
            "model": NATIVE, "messages": [{"role": "user", "content": "hi"}]})
    finally:
        gateway.stop()

    assert answer.status_code == 200, answer.text
    native, translated = fakes[NATIVE].requests
    betas = native.headers["anthropic-beta"].split(",")
    assert betas[:2] == ["files-api-2025-04-14", "context-management-2025-06-27"]
    assert sorted(betas) == sorted(set(BETAS.split(",")) | {"files-api-2025-04-14"})
    assert plain.status_code == 200
    assert translated.headers["anthropic-beta"] == \
        "files-api-2025-04-14,context-management-2025-06-27", "only configured ones"


# -- newer Messages requests through the bridge -------------------------------------------------

USER = {"role": "user", "content": "hi"}
SEARCHED = [USER, {"role": "assistant", "content": [
    {"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {"query": "web"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
        {"type": "tool_reference", "tool_name": "WebFetch"}]}]}]
DEFERRED = [{"name": "Read", "input_schema": {"type": "object"}},
            {"name": "WebFetch", "input_schema": {"type": "object"}, "defer_loading": True},
            {"name": "Cron", "input_schema": {"type": "object"}, "defer_loading": True}]
PDF = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}


@pytest.mark.parametrize(("fields", "expected"), [
    ({"messages": [USER, {"role": "system", "content": "be brief"},
                   {"role": "assistant", "content": "ok"},
                   {"role": "system", "content": [{"type": "text", "text": "now French"}]}]},
     {"messages": [USER, {"role": "system", "content": "be brief"},
                   {"role": "assistant", "content": "ok"},
                   {"role": "system", "content": "now French"}]}),
    ({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "notes"}},
        {"type": "document", "source": PDF, "title": "a.pdf"},
        {"type": "document", "source": {"type": "url", "url": "https://example.com/b.pdf"}},
        {"type": "text", "text": "Compare."}]}]},
     {"messages": [{"role": "user", "content": [
         {"type": "text", "text": "notes"},
         {"type": "file", "file": {"filename": "a.pdf",
                                   "file_data": "data:application/pdf;base64,JVBERi0x"}},
         {"type": "text", "text": "Compare."}]}]}),
    ({"messages": [USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "ZGF0YQ=="},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
         "input": {"query": "x"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
         "content": {"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"}},
        {"type": "text", "text": "Nothing found.", "citations": None}]}]},
     {"messages": [USER, {"role": "assistant", "content": "Nothing found."}]}),
    ({"messages": SEARCHED, "tools": DEFERRED},
     {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "toolu_1", "type": "function",
          "function": {"name": "ToolSearch", "arguments": '{"query": "web"}'}}]},
         {"role": "tool", "tool_call_id": "toolu_1", "content": ""}],
      "tools": [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
                for n in ("Read", "WebFetch")]}),
    ({"messages": [USER], "tools": DEFERRED[1:], "tool_choice": {"type": "auto"}},
     {"messages": [USER]}),
    ({"messages": [USER], "thinking": {"type": "adaptive", "display": "omitted"},
      "output_config": {"effort": "max", "format": {"type": "json_schema", "schema": {
          "type": "object"}}}},
     {"messages": [USER], "reasoning_effort": "high", "response_format": {
         "type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "object"}}}}),
    ({"messages": [USER], "thinking": {"type": "someday"}, "context_management": {"edits": []},
      "container": "c-1", "service_tier": "auto", "inference_geo": "us", "betas": ["x"]},
     {"messages": [USER]}),
], ids=["system-in-place", "documents", "blocks-without-a-place", "deferred-tools",
        "only-deferred-tools", "effort-and-format", "fields-without-a-place"])
def test_a_newer_request_is_translated_where_the_chat_format_has_a_place(
        fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert to_chat({"model": "m", "max_tokens": 5, **fields}) == {
        "model": "m", "max_tokens": 5, **expected}


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "narrator", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text"),
    ([USER, {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}],
     "messages[1].content[0].id"),
    ([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": None}]}]}], "messages[0].content[0].content[0].text"),
    ([{"role": "user", "content": [{"type": "image", "source": "https://x/y.png"}]}],
     "messages[0].content[0].source"),
])
def test_what_the_bridge_reads_is_checked_and_named(messages: list[dict[str, Any]],
                                                    param: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        to_chat({"model": "m", "max_tokens": 5, "messages": messages})
    assert refused.value.param == param


def test_the_head_leaves_roles_and_blocks_to_the_provider_that_reads_them() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [
        {"role": "system", "content": [{"type": "text", "text": 5}]},
        {"role": "user", "content": [{"type": "search_result", "source": "https://x",
                                      "title": "t", "content": [{"type": "text", "text": "x"}]},
                                     {"type": "someday_block", "anything": {"goes": 1}}]}],
        "system": 7, "tools": "soon", "thinking": {"type": "someday"}}

    head, _ = parse(json.dumps(body).encode(), MessagesRequest)

    assert head.model == "m"
