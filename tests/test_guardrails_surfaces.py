"""Guardrails seen from what the gateway exports and from the Responses API: a collector that
records every span (prompts and completions included) never receives a value a guardrail
pseudonymized or blocked, and a Responses stream gives the client its values back as the
provider's placeholders arrive, split across deltas.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.otlp_receiver import OtlpReceiver, Received
from tests.upstream import FakeUpstream, echo_prompt, prompt_text

EMAIL, PHONE = "alice@example.com", "+1 415 555 2671"
SECRET = "sk-proj-Zq8d7Xc2Vb9Nm4Lk1Jh6Gf3Ds5Aa0Pp"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[GatewayProcess, OtlpReceiver, FakeUpstream]]:
    with OtlpReceiver() as receiver, FakeUpstream(name="guarded") as upstream:
        doc = config({"main": provider(upstream.base_url, {"m": "m"})},
                     defaults={"circuit": {"enabled": False}},
                     telemetry={"otlp_endpoint": receiver.endpoint, "capture_content": True})
        doc["guardrails"] = {"pii": {"detect": ["email", "phone"], "action": "pseudonymize"},
                             "no-secrets": {"detect": ["secrets"], "action": "block"}}
        doc["models"] = {"m": {"guardrails": ["pii", "no-secrets"]}}
        gateway = GatewayProcess(tmp_path_factory.mktemp("guarded-traces"), doc,
                                 env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
        gateway.start()
        yield gateway, receiver, upstream
        gateway.stop()


def _text(spans: list[Received]) -> str:
    """Everything a collector got of these spans, as one text to grep."""
    return "\n".join(f"{s.name} {s.attributes} {s.status_message} {s.events}" for s in spans)


def test_no_span_holds_a_pseudonymized_value_or_a_blocked_secret(
        traced: tuple[GatewayProcess, OtlpReceiver, FakeUpstream]) -> None:
    gateway, receiver, upstream = traced
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    upstream.set_mode(echo_prompt(6))
    prompt = f"Mail {EMAIL} or call {PHONE}"

    whole = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": prompt}])
    streamed = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": prompt}], stream=True)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=[
            {"role": "user", "content": f"deploy with {SECRET}"}])

    assert whole.parse().choices[0].message.content == prompt
    assert "".join(c.choices[0].delta.content or "" for c in streamed.parse()
                   if c.choices) == prompt
    ids = [whole.headers["x-request-id"], streamed.headers["x-request-id"],
           refused.value.response.headers["x-request-id"]]
    # Each served request's trace: its server span, and the attempt span the served two have.
    exported = _text([span for request_id, least in zip(ids, (2, 2, 1), strict=True)
                      for span in receiver.trace(request_id,
                                                 until=lambda spans, n=least: len(spans) >= n)])
    assert "[EMAIL_1]" in exported and "[PHONE_1]" in exported, "content is captured"
    assert EMAIL not in exported and PHONE not in exported
    assert SECRET[8:] not in exported and "guardrail_violation" in exported


def test_a_responses_stream_gives_back_values_split_across_its_deltas(
        traced: tuple[GatewayProcess, OtlpReceiver, FakeUpstream]) -> None:
    gateway, _, upstream = traced
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    prompt = f"Write to {EMAIL} today"
    for split_at in (9, 13, 17):  # before, inside and at the end of `[EMAIL_1]`
        upstream.set_mode(echo_prompt(split_at))
        deltas: list[str] = []
        final: Any = None
        with client.responses.stream(model="m", input=prompt) as stream:
            for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            final = stream.get_final_response()
        assert "".join(deltas) == prompt, split_at
        assert final.output_text == prompt
        assert prompt_text(upstream.last_json) == "Write to [EMAIL_1] today"
