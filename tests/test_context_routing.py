"""A prompt too long for one model goes to one whose window is larger: skipped before any try
when the window is known, moved on when the upstream says so in its own words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from providers.contract.refusals import Limit, classify
from tests.fake_anthropic import FakeAnthropic
from tests.fake_gemini import FakeGemini
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, Mode, status

GEMINI_KEY = "AIzaSy-context-test-key-0000000000000"
# What each engine answers a prompt too long for its window: status, body (its own shape).
OPENAI = {"error": {"message": "This model's maximum context length is 128000 tokens. However, "
                               "your messages resulted in 150000 tokens. Please reduce the "
                               "length of the messages.", "type": "invalid_request_error",
                    "param": "messages", "code": "context_length_exceeded"}}
VLLM = {"object": "error", "message": "This model's maximum context length is 8192 tokens. "
        "However, you requested 40100 tokens (40000 in the messages, 100 in the completion). "
        "Please reduce the length of the messages or completion.", "type": "BadRequestError",
        "param": None, "code": 400}
SGLANG = {"object": "error", "message": "Requested token count exceeds the model's maximum "
          "context length of 8192 tokens. You requested a total of 40100 tokens: 40000 tokens "
          "from the input messages and 100 tokens for the completion. Please reduce the number "
          "of tokens in the input messages or the completion to fit within the limit.",
          "type": "BadRequestError", "param": None, "code": 400}
SGLANG_INPUT = {"object": "error", "message": "The input (40000 tokens) is longer than the "
                "model's context length (8192 tokens).", "type": "BadRequestError",
                "param": None, "code": 400}
LLAMA_CPP = {"error": {"code": 400, "message": "the request exceeds the available context size, "
                       "try increasing it", "type": "exceed_context_size_error",
                       "n_prompt_tokens": 40000, "n_ctx": 8192}}
OLLAMA = {"error": {"message": "the input length exceeds the context length",
                    "type": "invalid_request_error", "param": None, "code": None}}
ANTHROPIC = {"type": "error", "error": {"type": "invalid_request_error",
                                        "message": "prompt is too long: 208310 tokens > 200000 "
                                                   "maximum"}}
GEMINI = "The input token count (1196265) exceeds the maximum number of tokens allowed (1048576)."
OPENAI_SHAPED = {"openai": OPENAI, "vllm": VLLM, "sglang": SGLANG, "sglang-input": SGLANG_INPUT,
                 "llama.cpp": LLAMA_CPP, "ollama": OLLAMA}


def words(tokens: int) -> str:
    """About `tokens` tokens by the gateway's estimate (four characters a token)."""
    return "abc " * tokens


@pytest.mark.parametrize(("message", "error_type", "code"), [
    (OPENAI["error"]["message"], "invalid_request_error", "context_length_exceeded"),
    (VLLM["message"], "BadRequestError", None),
    (SGLANG["message"], "BadRequestError", None),
    (SGLANG_INPUT["message"], "BadRequestError", None),
    ("the request exceeds the available context size, try increasing it",
     "exceed_context_size_error", None),
    (OLLAMA["error"]["message"], None, None),
    (ANTHROPIC["error"]["message"], "invalid_request_error", None),
    ("input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, decrease "
     "input length or `max_tokens` and try again", "invalid_request_error", None),
    (GEMINI, None, None),
])
def test_each_engine_s_too_long_is_read_as_such(message: str, error_type: str | None,
                                                code: str | None) -> None:
    assert classify(400, message, error_type, code) is Limit.CONTEXT


def test_other_bad_requests_stay_bad_requests() -> None:
    assert classify(400, "temperature must be non-negative", "BadRequestError", None) is None
    assert classify(400, "messages: Field required", "invalid_request_error", None) is None
    assert classify(503, "This model's maximum context length is 8", None, None) is None


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, Any]]:
    with FakeUpstream(name="small") as small, FakeUpstream(name="big") as big, \
            FakeUpstream(name="mid") as mid, FakeUpstream(name="tight") as tight, \
            FakeAnthropic(name="claude") as claude, \
            FakeGemini(key=GEMINI_KEY, models=("gemini-2.5-flash",)) as gemini:
        yield {"small": small, "big": big, "mid": mid, "tight": tight, "claude": claude,
               "gemini": gemini}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, Any]) -> Iterator[GatewayProcess]:
    def window(model: str, tokens: int) -> dict[str, Any]:
        return {"id": model, "context_window": tokens}

    doc = config({
        "tight": provider(fakes["tight"].base_url, {"engine": "tight-model"}),
        "claude": {"type": "anthropic", "base_url": fakes["claude"].base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000", "models": {"anthropic": "claude-sonnet-4-5"}},
        "gemini": {"type": "google", "base_url": fakes["gemini"].base_url,
                   "api_key": GEMINI_KEY, "models": {"gemini": "gemini-2.5-flash"}},
        "small": provider(fakes["small"].base_url, {
            "long": window("small-model", 8192), "tiny": window("small-model", 8192),
            "stepped": window("small-model", 16000), "overflowing": window("small-model", 8192)}),
        "mid": provider(fakes["mid"].base_url, {
            "tiny": window("mid-model", 16000), "stepped": window("mid-model", 32000),
            "overflowing": window("mid-model", 32000)}),
        "big": provider(fakes["big"].base_url, {
            "long": window("big-model", 128000), "engine": window("big-model", 128000),
            "anthropic": window("big-model", 2_000_000), "gemini": window("big-model", 2_000_000),
            "stepped": window("big-model", 200000)}),
    }, defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("context"), doc).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> None:
    for fake in fakes.values():
        fake.reset()


def chat(gateway: GatewayProcess, model: str, text: str = "hi", **extra: Any) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": text}],
                            **extra})


def logged(gateway: GatewayProcess, answer: httpx.Response) -> dict[str, Any]:
    """The request log line of `answer`, once written (just after the answer is sent)."""
    request_id = answer.headers["x-request-id"]

    def line() -> list[dict[str, Any]]:
        return [e for e in gateway.log_events("request") if e["request_id"] == request_id]

    wait_until(lambda: bool(line()))
    return line()[0]


def test_a_40k_prompt_skips_the_8k_model_untried_and_is_answered_by_the_128k_one(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = chat(gateway, "long", words(40_000), max_tokens=100)

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "big"
    assert answer.headers["x-llms-attempts"] == "2"
    assert fakes["small"].requests == []
    assert len(fakes["big"].requests) == 1
    assert logged(gateway, answer)["failed"] == ["small:context_too_small"]


def test_a_prompt_that_fits_goes_to_the_first_candidate_as_before(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = chat(gateway, "long", words(1_000))

    assert answer.headers["x-llms-provider"] == "small"


@pytest.mark.parametrize("engine", sorted(OPENAI_SHAPED))
def test_an_openai_shaped_engine_s_own_too_long_moves_to_a_larger_window(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], engine: str) -> None:
    fakes["tight"].set_mode(status(400, body=json.dumps(OPENAI_SHAPED[engine])))

    answer = chat(gateway, "engine")

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "big"
    assert logged(gateway, answer)["failed"] == ["tight:context_length_exceeded"]


@pytest.mark.parametrize(("alias", "fake", "mode"), [
    ("anthropic", "claude", status(400, body=json.dumps(ANTHROPIC))),
    ("gemini", "gemini", status(400, GEMINI)),
])
def test_anthropic_s_and_gemini_s_own_too_long_moves_to_a_larger_window(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], alias: str, fake: str,
        mode: Mode) -> None:
    # Both models' windows come from genai-prices (200k, 1M): the next one must be larger.
    fakes[fake].set_mode(mode)

    answer = chat(gateway, alias)

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "big"
    assert logged(gateway, answer)["failed"] == [f"{fake}:context_length_exceeded"]


def test_after_an_overflow_only_larger_windows_are_tried(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["small"].set_mode(status(400, body=json.dumps(VLLM)))
    fakes["mid"].set_mode(status(400, body=json.dumps(VLLM)))

    answer = chat(gateway, "stepped")

    assert answer.headers["x-llms-provider"] == "big"
    assert len(fakes["small"].requests) == 1 and len(fakes["mid"].requests) == 1


def test_when_no_window_can_hold_it_the_client_gets_a_400_naming_the_largest(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = chat(gateway, "tiny", words(40_000))

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "context_length_exceeded", "messages", "invalid_request_error")
    assert "the largest context window tried is 16000 tokens" in error["message"]
    assert fakes["small"].requests == [] and fakes["mid"].requests == []


def test_when_every_upstream_says_too_long_the_client_gets_the_400(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["small"].set_mode(status(400, body=json.dumps(LLAMA_CPP)))
    fakes["mid"].set_mode(status(400, body=json.dumps(VLLM)))

    answer = chat(gateway, "overflowing")

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert "32000 tokens" in answer.json()["error"]["message"]


def test_the_requested_output_counts_against_the_window(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = chat(gateway, "long", words(1_000), max_tokens=10_000)

    assert answer.headers["x-llms-provider"] == "big"
    assert fakes["small"].requests == []


def test_a_streamed_40k_prompt_and_a_messages_one_skip_the_8k_model_too(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": "long", "stream": True,
            "messages": [{"role": "user", "content": words(40_000)}]}) as streamed:
        assert streamed.headers["x-llms-provider"] == "big"
        assert streamed.read().endswith(b"data: [DONE]\n\n")
    messages = httpx.post(f"{gateway.base_url}/messages", timeout=30, json={
        "model": "long", "max_tokens": 100,
        "messages": [{"role": "user", "content": words(40_000)}]})

    assert messages.status_code == 200, messages.text
    assert messages.headers["x-llms-provider"] == "big"
    assert fakes["small"].requests == []
