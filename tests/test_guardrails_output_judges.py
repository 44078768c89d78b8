"""A model as a judge of answers: what the provider wrote is read by a judge alias before the
client gets any of it.

A team puts a Llama Guard-style model (a fake that answers `safe`, or `unsafe\\nS1`) behind its
aliases with `"phases": ["output"]`. A whole answer is held until the judge says; an unsafe one
is the 400 `guardrail_violation` an input block gives. A stream is held by the gateway until it
ends, then judged: relayed as the events it was when safe, replaced by an error event when not,
none of its text sent. A judge that is down blocks or lets through as its `on_error` says. The
judge reads the answer as the other guardrails left it: placeholders, never the values.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, echo_prompt, held, ok, refusing_url
from tests.waiting import wait_until

EMAIL = "alice@example.com"
SAFE, UNSAFE = ok("safe"), ok("unsafe\nS1")
HARMFUL = "Step one of the forbidden recipe: mix the reagents"
LONG = "a long harmless answer " * 80  # past the `bounded` provider's max_answer_bytes


def _judge(alias: str = "guard", phases: tuple[str, ...] = ("output",),
           **settings: Any) -> dict[str, Any]:
    return {"judge": {"alias": alias, "timeout": 2, **settings}, "action": "block",
            "phases": list(phases)}


GUARDRAILS = {
    "pii": {"detect": ["email"], "action": "pseudonymize"},
    "answers-judged": _judge(),
    "both-judged": _judge(phases=("input", "output")),
    "judged-by-the-down": _judge("down-guard"),
    "judged-by-the-down-leniently": _judge("down-guard", on_error="allow"),
    "judged-leniently": _judge(on_error="allow"),
}
ALIASES = {"m": ["pii", "answers-judged"], "both": ["both-judged"],
           "down": ["judged-by-the-down"], "down-lenient": ["judged-by-the-down-leniently"],
           "bounded": ["answers-judged"], "bounded-lenient": ["judged-leniently"]}
BOUNDED = ("bounded", "bounded-lenient")


def _doc(main: FakeUpstream, judge: FakeUpstream) -> dict[str, Any]:
    doc = config({"main": provider(main.base_url, {alias: alias for alias in ALIASES
                                                   if alias not in BOUNDED}),
                  # Its whole answers, and so the streams an output judge holds, stop at 1 KB.
                  "small": provider(main.base_url, {alias: alias for alias in BOUNDED},
                                    max_answer_bytes=1024),
                  "judges": provider(judge.base_url, {"guard": "llama-guard"}),
                  "gone": provider(refusing_url(), {"down-guard": "llama-guard"})},
                 defaults={"circuit": {"enabled": False}})
    doc["guardrails"] = GUARDRAILS
    doc["models"] = {alias: {"guardrails": names} for alias, names in ALIASES.items()}
    return doc


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[FakeUpstream, FakeUpstream]]:
    with FakeUpstream(name="main") as main, FakeUpstream(name="judge") as judge:
        yield main, judge


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: tuple[FakeUpstream, FakeUpstream]) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("output-judges"), _doc(*fakes))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client(gateway: GatewayProcess, fakes: tuple[FakeUpstream, FakeUpstream]) -> openai.OpenAI:
    for fake in fakes:
        fake.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def _ask(client: openai.OpenAI, model: str, text: str = "hello") -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}])


def _streamed(client: openai.OpenAI, model: str, text: str = "hello",
              read: list[str] | None = None) -> str:
    """The text a streamed answer's content deltas carry, each added to `read` as it comes."""
    read = [] if read is None else read
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            read.append(chunk.choices[0].delta.content)
    return "".join(read)


def _asked(judge: FakeUpstream) -> str:
    """What the judge was last asked about."""
    messages = judge.last_json["messages"]
    assert len(messages) == 1 and messages[0]["role"] == "user"
    return str(messages[0]["content"])


def test_a_whole_answer_judged_safe_passes_and_the_judge_read_its_placeholders(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    main.set_mode(echo_prompt())
    judge.set_mode(SAFE)

    answer = _ask(client, "m", f"mail {EMAIL} the plan")

    assert answer.parse().choices[0].message.content == f"mail {EMAIL} the plan"
    assert answer.headers["x-llms-guardrails"] == "pseudonymize:pii=1"
    assert len(judge.requests) == 1 and judge.last_json["model"] == "llama-guard"
    assert _asked(judge) == "mail [EMAIL_1] the plan"
    assert EMAIL not in judge.requests[-1].body.decode()


def test_a_whole_answer_judged_unsafe_is_the_guardrail_violation_its_text_nowhere(
        gateway: GatewayProcess, client: openai.OpenAI,
        fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    main.set_mode(ok(HARMFUL))
    judge.set_mode(UNSAFE)

    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, "m", "how is it made?")

    body: Any = refused.value.body
    assert body["code"] == "guardrail_violation"
    assert body["message"] == \
        "Blocked by guardrail 'answers-judged': the answer was not passed by its judge"
    assert refused.value.response.headers["x-llms-guardrails"] == "block:answers-judged"
    assert HARMFUL not in refused.value.response.text
    assert len(main.requests) == 1 and _asked(judge) == HARMFUL
    request_id = refused.value.response.headers["x-request-id"]
    logged = gateway.request_line(request_id)
    assert (logged["status"], logged["error"], logged["outcome"]) == \
        (400, "guardrail_violation", "error")
    assert "forbidden recipe" not in gateway.logs()


def test_a_stream_judged_unsafe_ends_in_an_error_event_and_none_of_its_text_is_sent(
        gateway: GatewayProcess, client: openai.OpenAI,
        fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    main.set_mode(ok(HARMFUL))
    judge.set_mode(UNSAFE)
    read: list[str] = []

    with pytest.raises(openai.APIError) as ended:
        _streamed(client, "m", "how is it made?", read)

    assert read == []
    assert "'answers-judged'" in ended.value.message
    assert _asked(judge) == HARMFUL
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=10, json={
            "model": "m", "stream": True,
            "messages": [{"role": "user", "content": "again?"}]}) as raw:
        sent = raw.read().decode()
    assert raw.status_code == 200 and "guardrail_violation" in sent
    assert "[DONE]" not in sent and "forbidden" not in sent
    lines = [line for line in gateway.log_events("request") if line.get("model") == "m"]
    assert lines and all((line["status"], line["error"]) == (400, "guardrail_violation")
                         for line in lines[-2:])
    assert "forbidden recipe" not in gateway.logs()


def test_a_stream_judged_safe_is_held_until_judged_then_read_whole(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    main.set_mode(echo_prompt(split_at=9))
    judge.set_mode(held(SAFE))
    read: list[str] = []
    asked = f"write to {EMAIL} today"

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        streamed = pool.submit(_streamed, client, "m", asked, read)
        # The provider's whole stream is in before the judge is asked, and none of it is out.
        wait_until(lambda: len(judge.requests) == 1)
        assert read == [] and not streamed.done()
        judge.release()
        assert streamed.result(timeout=10) == asked

    assert _asked(judge) == "write to [EMAIL_1] today"


def test_a_long_stream_judged_safe_is_read_whole_by_the_judge_and_the_client(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    story = "once upon a time " * 300  # 1,200 events, 150 KB: read off the event loop
    main.set_mode(ok(story))
    judge.set_mode(SAFE)

    assert _streamed(client, "m") == story
    assert _asked(judge) == story


def test_a_judge_of_both_sides_reads_the_request_then_the_answer(
        client: openai.OpenAI, fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    main.set_mode(ok("the answer"))
    judge.set_mode(SAFE)

    assert _streamed(client, "both", "the question") == "the answer"

    asked = [request.json["messages"][0]["content"] for request in judge.requests]
    assert asked == ["the question", "the answer"]


def test_a_judge_that_is_down_blocks_or_lets_answers_through_as_its_on_error_says(
        gateway: GatewayProcess, client: openai.OpenAI,
        fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, _ = fakes
    main.set_mode(ok("an answer nobody judged"))

    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, "down")
    body: Any = refused.value.body
    assert body["code"] == "guardrail_violation" and "'judged-by-the-down'" in body["message"]
    read: list[str] = []
    with pytest.raises(openai.APIError):
        _streamed(client, "down", read=read)
    assert read == []

    let = _ask(client, "down-lenient")
    assert let.parse().choices[0].message.content == "an answer nobody judged"
    assert let.headers["x-llms-guardrails"] == "allow:judged-by-the-down-leniently=1"
    assert _streamed(client, "down-lenient") == "an answer nobody judged"
    failed = [line for line in gateway.log_events("guardrail_judge_failed")
              if line["guardrail"] == "judged-by-the-down-leniently"]
    assert len(failed) == 2 and {line["phase"] for line in failed} == {"output"}


def test_a_stream_past_the_answer_bound_is_not_held_its_judge_s_on_error_decides(
        gateway: GatewayProcess, client: openai.OpenAI,
        fakes: tuple[FakeUpstream, FakeUpstream]) -> None:
    main, judge = fakes
    main.set_mode(ok(LONG))
    judge.set_mode(SAFE)
    read: list[str] = []

    with pytest.raises(openai.APIError):
        _streamed(client, "bounded", read=read)
    assert read == []
    assert _streamed(client, "bounded-lenient") == LONG
    assert judge.requests == []
    reasons = {line["reason"] for line in gateway.log_events("guardrail_judge_failed")
               if line["guardrail"] in ("answers-judged", "judged-leniently")}
    assert reasons == {"answer over 1024 bytes"}
