"""`models` in llms.json: names served as other aliases (`alias_of`, `*` patterns) and fallback
chains across aliases, chosen by why the first alias failed."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, Mode, paused, status, stream_cut

HI = [{"role": "user", "content": "hi"}]
# OpenAI's refusal by its content policy, as its API words it.
POLICY = json.dumps({"error": {
    "message": "Your request was rejected as a result of our safety system. Your prompt may "
               "contain text that is not allowed by our safety system.",
    "type": "invalid_request_error", "param": None, "code": "content_policy_violation"}})


def snapshot(models: dict[str, Any], served: dict[str, str] | None = None) -> Any:
    doc = config({"p": provider("http://127.0.0.1:9/v1", served or {"smart": "s", "fast": "f",
                                                                     "claude-exact": "e"})},
                 models=models)
    return parse(json.dumps(doc), Path("llms.json"), {})


def test_an_exact_name_wins_over_a_pattern_and_the_longest_pattern_over_a_shorter() -> None:
    config_ = snapshot({"claude-*": {"alias_of": "smart"},
                        "claude-haiku-*": {"alias_of": "fast"},
                        "claude-opus-4-8": {"alias_of": "fast"}})

    assert config_.resolve("claude-sonnet-4-5") == "smart"
    assert config_.resolve("claude-haiku-4-5-20251001") == "fast"
    assert config_.resolve("claude-opus-4-8") == "fast"  # named exactly: not the pattern's
    assert config_.resolve("claude-exact") == "claude-exact"  # a provider's own alias
    assert config_.resolve("gpt-9") == "gpt-9"  # unknown: a 404 later, as before


def test_an_alias_of_an_alias_serves_the_last_one() -> None:
    config_ = snapshot({"sonnet": {"alias_of": "best"}, "best": {"alias_of": "smart"},
                        "claude-*": {"alias_of": "sonnet"}})

    assert config_.resolve("sonnet") == "smart"
    assert config_.resolve("claude-x") == "smart"


@pytest.mark.parametrize(("models", "says"), [
    ({"a": {"alias_of": "b"}, "b": {"alias_of": "a"}}, "models.a.alias_of: a loop (a → b → a)"),
    ({"a": {"alias_of": "nowhere"}}, "models.a.alias_of: 'nowhere' is no alias"),
    ({"claude-*": {"routing": {"strategy": "order"}}}, "models.claude-*: a pattern needs "
                                                       "alias_of"),
    ({"smart": {"fallbacks": ["fast"]}, "fast": {"fallbacks": ["smart"]}},
     "models.smart.fallbacks: a loop (smart → fast → smart)"),
    ({"smart": {"fallbacks": ["smart"]}}, "models.smart.fallbacks: a loop (smart → smart)"),
    ({"smart": {"fallbacks": {"default": ["gone"]}}}, "models.smart.fallbacks: 'gone' is no "
                                                      "alias"),
    ({"smart": {"fallbacks": {"too_slow": ["fast"]}}},
     "models.smart.fallbacks.too_slow: not a failure class"),
    ({"smart": {"fallbacks": {"rate_limit": ["fast"]}},
      "fast": {"fallbacks": {"default": ["smart"]}}},
     "a loop (smart → fast → smart)"),
])
def test_loops_and_unknown_names_are_refused_at_load(models: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        snapshot(models)

    assert "llms.json: " in str(refused.value)
    assert says in str(refused.value)


def test_a_target_served_only_by_a_disabled_provider_is_no_config_error() -> None:
    doc = config({"p": provider("http://127.0.0.1:9/v1", {"smart": "s"}, api_key="$UNSET_KEY")},
                 models={"claude-*": {"alias_of": "smart"}})

    assert parse(json.dumps(doc), Path("llms.json"), {}).resolve("claude-x") == "smart"


def test_a_chain_follows_each_fallback_s_own_chain_for_the_same_class() -> None:
    config_ = snapshot({"smart": {"fallbacks": {"context_window": ["fast"], "default": []}},
                        "fast": {"fallbacks": ["claude-exact"]}})

    assert config_.chains.after("smart", "context_window") == ("fast", "claude-exact")
    assert config_.chains.after("smart", "rate_limit") == ()
    assert config_.chains.after("fast", "content_policy") == ("claude-exact",)


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    with FakeUpstream(name="big") as big, FakeUpstream(name="small") as small, \
            FakeUpstream(name="spare") as spare, FakeAnthropic(name="claude") as claude:
        yield {"big": big, "small": small, "spare": spare, "claude": claude}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("aliases"), document(fakes)).start()
    yield process
    process.stop()


def document(fakes: dict[str, FakeUpstream], **models: Any) -> dict[str, Any]:
    return config({
        "big": provider(fakes["big"].base_url, {
            "smart": {"id": "big-model", "price": {"input": 10, "output": 30}},
            "guarded": "big-guarded", "busy": "big-busy"}),
        "small": provider(fakes["small"].base_url, {
            "fast": {"id": "small-model", "price": {"input": 1, "output": 2}},
            "guarded": "big-guarded"}),
        "spare": provider(fakes["spare"].base_url, {
            "spare": {"id": "spare-model", "price": {"input": 2, "output": 4}}}),
        "claude": {"type": "anthropic", "base_url": fakes["claude"].base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000", "models": {"native": "claude-sonnet-4-5",
                                                          "careful": "claude-careful"}},
    }, defaults={"circuit": {"enabled": False}, "retries": {"attempts": 2, "backoff": 0.01}},
        models={
            "claude-*": {"alias_of": "smart"},
            "claude-haiku-*": {"alias_of": "fast"},
            "sonnet": {"alias_of": "smart"},
            "smart": {"fallbacks": ["fast"]},
            "guarded": {"fallbacks": {"content_policy": ["spare"], "default": []}},
            "busy": {"fallbacks": {"rate_limit": ["spare"], "default": ["fast"]}},
            "careful": {"fallbacks": {"content_policy": ["spare"], "default": []}},
            **models,
        })


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> None:
    for fake in fakes.values():
        fake.reset()


def chat(gateway: GatewayProcess, model: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": model, "messages": HI})


def logged(gateway: GatewayProcess, answer: httpx.Response) -> dict[str, Any]:
    """The request log line of `answer`, once written (just after the answer is sent)."""
    request_id = answer.headers["x-request-id"]

    def line() -> list[dict[str, Any]]:
        return [e for e in gateway.log_events("request") if e["request_id"] == request_id]

    wait_until(lambda: bool(line()))
    return line()[0]


def test_claude_code_s_changing_names_reach_their_alias_through_the_anthropic_sdk(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    with anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0) as client:
        opus = client.messages.with_raw_response.create(
            model="claude-opus-4-8", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
        haiku = client.messages.with_raw_response.create(
            model="claude-haiku-4-5-20251001", max_tokens=64,
            messages=[{"role": "user", "content": "hi"}])

    assert (opus.headers["x-llms-model"], opus.headers["x-llms-provider"]) == ("smart", "big")
    assert (haiku.headers["x-llms-model"], haiku.headers["x-llms-provider"]) == ("fast", "small")
    assert opus.parse().model == "smart"  # the alias that served, as for any bridged alias
    assert [r.json["model"] for r in fakes["big"].requests] == ["big-model"]
    assert [r.json["model"] for r in fakes["small"].requests] == ["small-model"]
    for raw, sent, alias in ((opus, "claude-opus-4-8", "smart"),
                             (haiku, "claude-haiku-4-5-20251001", "fast")):
        line = logged(gateway, raw.http_response)
        assert (line["model"], line["alias"]) == (sent, alias)  # the name sent is kept


def test_the_models_list_names_exact_aliases_and_no_pattern(gateway: GatewayProcess) -> None:
    listed = {m["id"] for m in httpx.get(f"{gateway.base_url}/models").json()["data"]}

    assert {"smart", "fast", "sonnet"} <= listed
    assert not any("*" in name for name in listed)


def test_a_failed_alias_falls_back_and_the_answer_is_the_fallback_s(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(status(503), status(503))

    answer = chat(gateway, "sonnet")

    assert answer.status_code == 200, answer.text
    assert (answer.headers["x-llms-model"], answer.headers["x-llms-provider"]) == ("fast",
                                                                                    "small")
    assert answer.headers["x-llms-attempts"] == "3"  # two tries at big, one at small
    usage = answer.json()["usage"]
    expected = (usage["prompt_tokens"] * 1 + usage["completion_tokens"] * 2) / 1_000_000
    assert float(answer.headers["x-llms-cost"]) == pytest.approx(expected, abs=1e-6)


def test_a_content_policy_refusal_is_never_tried_again_on_its_model_and_follows_its_chain(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(status(400, body=POLICY))

    answer = chat(gateway, "guarded")

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-model"] == "spare"
    assert len(fakes["big"].requests) == 1  # retries: 2, yet one try at the refusing model
    assert fakes["small"].requests == []  # the same upstream model: skipped
    assert logged(gateway, answer)["failed"] == ["big:content_policy", "small:content_policy"]


def test_a_refusal_with_no_chain_left_is_the_upstream_s_own_400(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(status(400, body=POLICY))
    fakes["spare"].set_mode(status(400, body=POLICY))

    answer = chat(gateway, "guarded")

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "content_policy_violation"


def test_rate_limits_follow_their_own_chain_and_other_failures_the_default(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(status(429), status(429), status(503), status(503))

    limited, down = chat(gateway, "busy"), chat(gateway, "busy")

    assert limited.headers["x-llms-model"] == "spare"
    assert down.headers["x-llms-model"] == "fast"


def test_a_reload_applies_new_patterns(start_gateway: Callable[..., GatewayProcess],
                                       fakes: dict[str, FakeUpstream]) -> None:
    gateway = start_gateway(document(fakes))
    assert chat(gateway, "claude-opus-4-8").headers["x-llms-model"] == "smart"

    gateway.write_config(document(fakes, **{"claude-opus-*": {"alias_of": "fast"}}))

    wait_until(lambda: chat(gateway, "claude-opus-4-8").headers["x-llms-model"] == "fast")
    assert chat(gateway, "claude-sonnet-4-5").headers["x-llms-model"] == "smart"


FILTERED = Mode("ok", chunks=("",), finish_reason="content_filter")


def test_an_answer_filtered_before_any_content_is_a_refusal_that_follows_the_chain(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(FILTERED)

    answer = chat(gateway, "guarded")

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-model"] == "spare"
    assert answer.json()["choices"][0]["finish_reason"] == "stop"
    assert len(fakes["big"].requests) == 1 and fakes["small"].requests == []


def test_a_filtered_answer_with_no_chain_is_relayed_as_before(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["small"].set_mode(FILTERED)

    answer = chat(gateway, "fast")

    assert answer.status_code == 200
    assert answer.json()["choices"][0]["finish_reason"] == "content_filter"


def test_a_filtered_answer_is_kept_when_its_chain_fails_too(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(FILTERED)
    fakes["spare"].set_mode(status(503))

    answer = chat(gateway, "guarded")

    assert answer.status_code == 200
    assert answer.headers["x-llms-model"] == "guarded"
    assert answer.json()["choices"][0]["finish_reason"] == "content_filter"


def streamed(gateway: GatewayProcess, model: str) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """A streamed chat answer and its events, read to the end."""
    body = {"model": model, "messages": HI, "stream": True}
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body,
                      timeout=30) as answer:
        events = [json.loads(line.removeprefix("data: ")) for line in answer.iter_lines()
                  if line.startswith("data: {")]
    return answer, events


def written(events: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """A stream's text, and its finish reasons."""
    choices = [c for e in events for c in e.get("choices", [])]
    return ("".join(c["delta"].get("content") or "" for c in choices),
            [c["finish_reason"] for c in choices if c.get("finish_reason")])


def test_a_stream_filtered_after_its_role_chunk_follows_the_content_policy_chain(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    # OpenAI's way: a role-only chunk, then (a moment later, as it decides) the filter's finish
    fakes["big"].set_mode(replace(FILTERED, delay_between_chunks=0.05))

    answer, events = streamed(gateway, "guarded")

    assert answer.status_code == 200
    assert answer.headers["x-llms-model"] == "spare"
    assert written(events) == ("Hello from spare", ["stop"]), "nothing of big's stream is sent"
    assert len(fakes["big"].requests) == 1 and fakes["small"].requests == []
    assert len(fakes["spare"].requests) == 1


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_an_anthropic_refusal_before_any_content_follows_the_content_policy_chain(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream], stream: bool) -> None:
    fakes["claude"].set_mode(Mode("ok", content="", finish_reason="content_filter",
                                  delay_between_chunks=0.05))

    if stream:
        answer, events = streamed(gateway, "careful")
        assert written(events) == ("Hello from spare", ["stop"])
    else:
        answer = chat(gateway, "careful")
        assert answer.json()["choices"][0]["message"]["content"] == "Hello from spare"

    assert answer.status_code == 200
    assert answer.headers["x-llms-model"] == "spare"
    assert len(fakes["claude"].requests) == 1


def test_a_stream_filtered_after_some_content_is_relayed_as_it_is(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(Mode("ok", chunks=("I can", ""), finish_reason="content_filter"))

    answer, events = streamed(gateway, "guarded")

    assert answer.headers["x-llms-model"] == "guarded"
    assert written(events) == ("I can", ["content_filter"]), "a begun answer is an answer"
    assert fakes["spare"].requests == []


def test_a_guarded_stream_that_breaks_before_any_content_ends_with_its_error(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(stream_cut(after_chunks=0))  # its role chunk, then a reset

    answer, events = streamed(gateway, "guarded")

    assert answer.headers["x-llms-model"] == "guarded"
    assert "failed mid-stream" in events[-1]["error"]["message"], "never a silent end"
    assert fakes["spare"].requests == [], "a break is not a filter"


def test_a_guarded_stream_s_first_content_is_not_held_until_more_comes(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["big"].set_mode(paused(after_events=2, content="Hello there"))  # role, "Hello "
    body = {"model": "guarded", "messages": HI, "stream": True}

    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", json=body,
                      timeout=10) as answer:
        lines = answer.iter_lines()
        first = next(json.loads(line.removeprefix("data: ")) for line in lines
                     if '"content": "Hello' in line or '"content":"Hello' in line)
        fakes["big"].release()  # only now does the upstream send the rest
        rest = [line for line in lines if line]

    assert first["choices"][0]["delta"]["content"].startswith("Hello")
    assert rest[-1] == "data: [DONE]" and answer.headers["x-llms-model"] == "guarded"


def test_a_name_a_pattern_serves_can_be_retrieved_as_a_model(gateway: GatewayProcess) -> None:
    found = httpx.get(f"{gateway.base_url}/models/claude-opus-4-8")
    missing = httpx.get(f"{gateway.base_url}/models/gpt-9")

    assert found.status_code == 200 and found.json()["id"] == "claude-opus-4-8"
    assert missing.status_code == 404
