"""No input makes a 500: every wrong type a translator would trip over is a 400 naming its place,
and a 500 that a bug still causes is never invisible (logged with its request id, counted)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import plugins
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A gateway with an OpenAI-speaking provider (`oa-m`) and an Anthropic one (`an-m`)."""
    with FakeUpstream(name="oa") as oa, FakeAnthropic(name="an") as an:
        gateway = GatewayProcess(tmp_path_factory.mktemp("mixed"), config({
            "oa": provider(oa.base_url, {"oa-m": "m"}),
            "an": {"type": "anthropic", "base_url": an.base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000", "models": {"an-m": "m"}},
        }))
        gateway.start()
        yield gateway
        gateway.stop()


CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("chat/completions", "an-m", {"messages": [{"role": "user", "content": 1}]},
     "messages[0].content"),
    ("chat/completions", "an-m", {"messages": [{"role": "user", "content": [1]}]},
     "messages[0].content[0]"),
    ("chat/completions", "an-m", {"messages": [{"role": "user", "content": {}}]},
     "messages[0].content"),
    ("chat/completions", "an-m", {"messages": [{"role": "user", "content": [[]]}]},
     "messages[0].content[0]"),
    ("chat/completions", "an-m", {"messages": [*HI, {"role": "assistant", "tool_calls": [1]}]},
     "messages[1].tool_calls[0]"),
    ("chat/completions", "an-m", {"messages": [*HI, {"role": "assistant", "tool_calls": "x"}]},
     "messages[1].tool_calls"),
    ("chat/completions", "an-m", {"messages": HI, "tools": "x"}, "tools"),
    ("chat/completions", "an-m", {"messages": HI, "tool_choice": {"function": "x"}},
     "tool_choice.function"),
    ("chat/completions", "an-m",
     {"messages": HI, "response_format": {"type": "json_schema", "json_schema": "x"}},
     "response_format.json_schema"),
    ("chat/completions", "an-m", {"messages": HI, "chat_template_kwargs": "x"},
     "chat_template_kwargs"),
    ("chat/completions", "an-m", {"messages": [{"role": "assistant", "function_call": "x"}]},
     "messages[0].function_call"),
    ("chat/completions", "oa-m", {"messages": [{"role": "assistant", "function_call": "x"}]},
     "messages[0].function_call"),
    ("responses", "oa-m", {"input": [{"type": "message"}]}, "input[0].role"),
    ("responses", "an-m", {"input": [{"type": "function_call"}]}, "input[0].call_id"),
    ("responses", "oa-m", {"input": "hi", "tools": [1]}, "tools[0]"),
    ("responses", "an-m", {"input": "hi", "text": "x"}, "text"),
    ("responses", "an-m", {"input": "hi", "reasoning": "x"}, "reasoning"),
]


@pytest.mark.parametrize(("endpoint", "model", "body", "param"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in CASES])
def test_a_wrong_type_is_a_400_naming_its_place(mixed: GatewayProcess, endpoint: str,
                                                 model: str, body: dict[str, Any],
                                                 param: str) -> None:
    response = httpx.post(f"{mixed.base_url}/{endpoint}", json={"model": model, **body})

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", param)


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions", "responses"])
@pytest.mark.parametrize("model", ["oa-m", "an-m"])
def test_bytes_that_are_not_utf8_and_numbers_past_64_bits_are_400s(
        mixed: GatewayProcess, endpoint: str, model: str) -> None:
    head = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "prompt": "x", ' \
           b'"input": "x"' % model.encode()
    for body in (head + b', "user": "m\xff"}', head + b', "seed": ' + b"9" * 100_000 + b"}",
                 head + b', "metadata": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"):
        response = httpx.post(f"{mixed.base_url}/{endpoint}", content=body,
                              headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_request"


BUGGY_KIND = """
    from providers.contract.provider import Provider

    class Kind(Provider):
        async def send(self, request, upstream_model):
            raise RuntimeError("a bug in a plug-in")

        async def stream(self, request, upstream_model):
            raise RuntimeError("a bug in a plug-in")
            yield b""
"""


def test_a_500_from_a_bug_is_logged_with_its_request_id_and_counted(
        start_gateway: Callable[..., GatewayProcess], tmp_path: Path) -> None:
    gateway = start_gateway(config({"b": {"type": "buggy", "models": {"m": "m"}}}),
                            env=plugins.install(tmp_path, "buggy", BUGGY_KIND))

    response = httpx.post(f"{gateway.base_url}/chat/completions", json={"model": "m",
                                                                       "messages": HI})

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "plug-in" not in response.text  # no details leave
    request_id = response.headers["x-request-id"]
    logged = gateway.wait_for_log("unhandled_error")[-1]
    assert logged["request_id"] == request_id and "RuntimeError" in logged["exception"]
    assert gateway.wait_for_log("request")[-1]["status"] == 500
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert any(line.startswith("llms_requests_total{") and 'status="500"' in line
               for line in metrics.splitlines()), metrics
