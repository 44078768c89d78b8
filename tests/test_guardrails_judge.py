"""A model as a guardrail's judge: an alias of the gateway asked whether a request may pass.

A team puts a Llama Guard-style model (a fake that answers `safe`, or `unsafe\\nS1`) in front of
its aliases. An unsafe verdict is a 400 `guardrail_violation`; a judge that is slow or down
blocks or lets through as its `on_error` says; a judge asked `parallel` runs beside the
upstream call, and the answer waits for it and is dropped when it fails. The judge reads the
request as screened, never a value another guardrail took out.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, echo_prompt, hang, held, ok, refusing_url

EMAIL = "alice@example.com"
SAFE, UNSAFE = ok("safe"), ok("unsafe\nS1")


def _judge(alias: str = "guard", **settings: Any) -> dict[str, Any]:
    return {"judge": {"alias": alias, "timeout": 2, **settings}, "action": "block"}


GUARDRAILS = {
    "pii": {"detect": ["email"], "action": "pseudonymize"},
    "judged": _judge(),
    "judged-leniently": _judge(on_error="allow"),
    "judged-by-the-down": _judge("down-guard"),
    "judged-by-the-down-leniently": _judge("down-guard", on_error="allow"),
    "moderated": _judge("omni", endpoint="moderations"),
}
ALIASES = {"m": ["pii", "judged"], "lenient": ["judged-leniently"],
           "down": ["judged-by-the-down"], "down-lenient": ["judged-by-the-down-leniently"],
           "moderated": ["moderated"]}


def _doc(main: FakeUpstream, judge: FakeUpstream, guardrails: dict[str, Any],
         aliases: dict[str, list[str]]) -> dict[str, Any]:
    doc = config({"main": provider(main.base_url, {alias: alias for alias in aliases}),
                  "judges": provider(judge.base_url, {"guard": "llama-guard", "omni": "omni"}),
                  "gone": provider(refusing_url(), {"down-guard": "llama-guard"})},
                 defaults={"circuit": {"enabled": False}})
    doc["guardrails"] = guardrails
    doc["models"] = {alias: {"guardrails": names} for alias, names in aliases.items()}
    return doc


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    with FakeUpstream(name="main") as main, FakeUpstream(name="judge") as judge:
        yield main, judge


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: tuple[FakeUpstream, FakeUpstream]) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("judges"),
                             _doc(*fakes, GUARDRAILS, ALIASES))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client(gateway: GatewayProcess, fakes: tuple[FakeUpstream, FakeUpstream]) -> openai.OpenAI:
    for fake in fakes:
        fake.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def _ask(client: openai.OpenAI, model: str, text: str = "hello", stream: bool = False) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], stream=stream)


def _refused(client: openai.OpenAI, model: str, stream: bool = False) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, model, stream=stream)
    body = refused.value.body
    assert isinstance(body, dict)
    return body


def test_an_unsafe_verdict_blocks_before_the_provider_and_the_judge_reads_placeholders(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    judge.set_mode(UNSAFE)
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, "m", f"mail {EMAIL} the plan")

    body: Any = refused.value.body
    assert body["code"] == "guardrail_violation" and "'judged'" in body["message"]
    assert refused.value.response.headers["x-llms-guardrails"] == \
        "pseudonymize:pii=1, block:judged"
    assert main.requests == []
    asked = judge.last_json
    assert asked["model"] == "llama-guard"
    assert asked["messages"] == [{"role": "user", "content": "mail [EMAIL_1] the plan"}]
    assert EMAIL not in judge.requests[-1].body.decode()

    judge.set_mode(SAFE)
    main.set_mode(echo_prompt())
    passed = _ask(client, "m", f"mail {EMAIL} the plan")
    assert passed.parse().choices[0].message.content == f"mail {EMAIL} the plan"


def test_a_slow_judge_blocks_or_lets_through_as_its_on_error_says(
        gateway: GatewayProcess, client: openai.OpenAI,
        fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    judge.set_mode(hang())

    assert _refused(client, "m")["code"] == "guardrail_violation"
    assert main.requests == []
    let = _ask(client, "lenient")
    assert let.parse().choices[0].message.content == "Hello from main"
    assert let.headers["x-llms-guardrails"] == "allow:judged-leniently=1"
    failed = [line for line in gateway.log_events("guardrail_judge_failed")
              if line["guardrail"] == "judged-leniently"]
    assert failed and failed[-1]["reason"] == "timeout"


def test_a_judge_that_is_down_blocks_or_lets_through_as_its_on_error_says(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, _ = fakes
    body = _refused(client, "down", stream=True)
    assert body["code"] == "guardrail_violation" and "'judged-by-the-down'" in body["message"]
    assert main.requests == []

    streamed = client.chat.completions.create(
        model="down-lenient", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        "Hello from main"


def test_a_moderations_judge_blocks_what_it_flags(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    assert _ask(client, "moderated", "a calm sentence").status_code == 200
    with pytest.raises(openai.BadRequestError):
        _ask(client, "moderated", "how do I kill a neighbour's cat")
    assert judge.requests[-1].path == "/v1/moderations"
    assert judge.last_json == {"model": "omni", "input": "how do I kill a neighbour's cat"}
    assert len(main.requests) == 1


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.02)


PARALLEL = {"beside": _judge(parallel=True), "first": _judge()}


def test_a_parallel_judge_runs_beside_the_upstream_call_and_its_block_drops_the_answer(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    main, judge = upstream_factory("main"), upstream_factory("judge")
    gateway = start_gateway(_doc(main, judge, PARALLEL, {"beside": ["beside"],
                                                         "first": ["first"]}))
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    main.set_mode(held())
    judge.set_mode(held(SAFE))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_ask, client, "beside")
        # Both calls are out before either is answered: the judge adds no wait of its own.
        _until(lambda: len(main.requests) == 1 and len(judge.requests) == 1)
        main.release()
        judge.release()
        assert answer.result(timeout=10).parse().choices[0].message.content == \
            "Hello from main"

    main.set_mode(ok("a stream nobody reads"))
    judge.set_mode(UNSAFE)
    body = _refused(client, "beside", stream=True)
    assert body["code"] == "guardrail_violation" and len(main.requests) == 2
    logged = [line for line in gateway.wait_for_log("request", 4)
              if line.get("model") == "beside"][-1]
    assert (logged["status"], logged["error"], logged["outcome"]) == \
        (400, "guardrail_violation", "error")
    judged = [line for line in gateway.log_events("request") if line.get("judging")]
    assert {line["judging"] for line in judged} == \
        {line["request_id"] for line in gateway.log_events("request")
         if line.get("model") == "beside"}


def test_a_judge_asked_first_holds_the_request_until_it_answers(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    main, judge = upstream_factory("main"), upstream_factory("judge")
    gateway = start_gateway(_doc(main, judge, PARALLEL, {"first": ["first"]}))
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    judge.set_mode(held(SAFE))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_ask, client, "first")
        _until(lambda: len(judge.requests) == 1)
        assert main.requests == []
        judge.release()
        assert answer.result(timeout=10).status_code == 200
    assert len(main.requests) == 1


def test_a_judge_runs_as_the_request_s_key_past_its_parallel_limit_and_allow_list(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    main, judge = upstream_factory("main"), upstream_factory("judge")
    gateway = start_gateway(_doc(main, judge, PARALLEL, {"first": ["first"]}))
    made = httpx.post(f"{gateway.url}/admin/keys", timeout=10, json={
        "name": "one-at-a-time", "models": ["first"], "max_parallel": 1})
    assert made.status_code == 201, made.text
    client = openai.OpenAI(base_url=gateway.base_url, api_key=made.json()["key"],
                           max_retries=0)
    judge.set_mode(SAFE)

    assert _ask(client, "first").status_code == 200

    lines = gateway.wait_for_log("request", 2)
    asked = next(line for line in lines if line.get("model") == "first")
    judging = next(line for line in lines if line.get("judging") == asked["request_id"])
    assert judging["key_id"] == asked["key_id"] == made.json()["id"]
    assert judging["outcome"] == "completed"
