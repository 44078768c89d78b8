"""Guardrails' pure parts: what each detector finds (and what its check turns down), and a JSON
value screened and given back outside a request, as the MCP gateway will call it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from gateway.core.settings.guardrails import GuardrailPolicy
from gateway.guardrails.detectors import Detector
from gateway.guardrails.policies import Guardrail, compiled
from gateway.guardrails.screening import GuardrailViolation
from gateway.guardrails.values import screen_value
from tests.gateway_process import config, provider

EVERY = Detector(["email", "phone", "card", "iban", "ip", "secrets", "national_id"],
                 region="US")
SECRET = "sk-proj-Zq8d7Xc2Vb9Nm4Lk1Jh6Gf3Ds5Aa0Pp"


@pytest.mark.parametrize(("text", "found"), [
    ("mail alice@example.com now", [("alice@example.com", "EMAIL")]),
    ("x.alice+tag@mail.example.org.", [("x.alice+tag@mail.example.org", "EMAIL")]),
    ("call +1 415 555 2671.", [("+1 415 555 2671", "PHONE")]),
    ("call (415) 555-2671", [("(415) 555-2671", "PHONE")]),
    ("card 4111 1111 1111 1111!", [("4111 1111 1111 1111", "CARD")]),
    ("iban GB82 WEST 1234 5698 7654 32 ok", [("GB82 WEST 1234 5698 7654 32", "IBAN")]),
    ("at 192.168.1.20, or 2001:db8::8a2e:370:7334",
     [("192.168.1.20", "IP"), ("2001:db8::8a2e:370:7334", "IP")]),
    ("host 10.0.0.1 5551234", [("10.0.0.1", "IP")]),
    (f"key {SECRET}", [(SECRET, "SECRET")]),
    ("AKIAIOSFODNN7EXAMPLE", [("AKIAIOSFODNN7EXAMPLE", "SECRET")]),
    ("token ghp_" + "a" * 36, [("ghp_" + "a" * 36, "SECRET")]),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc",
     [("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abc", "SECRET")]),
    ("-----BEGIN RSA PRIVATE KEY-----\nMII\n-----END RSA PRIVATE KEY-----!",
     [("-----BEGIN RSA PRIVATE KEY-----\nMII\n-----END RSA PRIVATE KEY-----", "SECRET")]),
    ("ssn 536-90-4399", [("536-90-4399", "NATIONAL_ID")]),
    ("dni 12345678Z", [("12345678Z", "NATIONAL_ID")]),
])
def test_each_detector_finds_its_values(text: str, found: list[tuple[str, str]]) -> None:
    assert [(text[f.start:f.end], f.category) for f in EVERY.find(text)] == found


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1112",  # Luhn-invalid
    "iban GB82 WEST 1234 5698 7654 33",  # mod 97 fails
    "dni 12345678A",  # wrong letter
    "ip 999.1.1.1",
    f"inside a word: x{SECRET}",
    "a12345678901 and 2024 2024",
    "no address: alice@ and @example.com",
])
def test_what_fails_its_check_or_stands_inside_a_word_is_not_found(text: str) -> None:
    assert EVERY.find(text) == []


def test_words_and_patterns_of_the_operator_s_own() -> None:
    detector = Detector([], {"ORDER": r"ORD-\d{6}"}, ["Project X"])
    text = "project x ships ORD-123456; myproject x does not"
    assert [(text[f.start:f.end], f.category) for f in detector.find(text)] == \
        [("project x", "WORD"), ("ORD-123456", "ORDER")]


def _guardrail(name: str, **policy: Any) -> Guardrail:
    return compiled(name, GuardrailPolicy(**policy))


def test_a_tool_s_arguments_get_placeholders_and_its_result_gets_the_values_back() -> None:
    pii = [_guardrail("pii", detect=("email",), action="pseudonymize")]
    arguments = {"name": "alice@example.com", "cc": ["bob@example.org", "alice@example.com"],
                 "count": 3}

    sent, screening = screen_value(arguments, pii, "input")

    assert sent == {"name": "[EMAIL_1]", "cc": ["[EMAIL_2]", "[EMAIL_1]"], "count": 3}
    assert arguments["name"] == "alice@example.com", "the caller's value is not changed"
    result, _ = screen_value("sent to [EMAIL_1] and [EMAIL_2]", pii, "output", screening)
    assert result == "sent to alice@example.com and bob@example.org"
    assert screening.header() == "pseudonymize:pii=3"


def test_a_tool_s_value_blocked_or_masked() -> None:
    block = [_guardrail("no-secrets", detect=("secrets",), action="block")]
    with pytest.raises(GuardrailViolation) as refused:
        screen_value({"query": f"use {SECRET}"}, block, "input")
    assert "'no-secrets'" in str(refused.value) and SECRET not in str(refused.value)
    with pytest.raises(GuardrailViolation):
        screen_value([{"text": SECRET}], block, "output")

    mask = [_guardrail("masked", detect=("email",), action="mask", phases=("output",))]
    unchanged = {"to": "alice@example.com"}
    assert screen_value(unchanged, mask, "input")[0] is unchanged
    assert screen_value({"text": "mail alice@example.com"}, mask, "output")[0] == \
        {"text": "mail [EMAIL]"}


def test_a_judge_reads_requests_blocks_and_names_an_alias_the_gateway_serves(
        tmp_path: Path) -> None:
    doc = config({"main": provider("http://127.0.0.1:9/v1", {"m": "m", "guard": "guard"})})
    doc["guardrails"] = {"judged": {"judge": {"alias": "guard"}}}
    judged = parse(json.dumps(doc), tmp_path / "llms.json", {}).guardrails["judged"]
    assert judged.sides == ("input",) and judged.action == "block"
    assert judged.judge is not None and (judged.judge.timeout, judged.judge.on_error) == \
        (10.0, "block")

    for wrong, said in (({"alias": "gaurd"}, r"judge\.alias: no model named 'gaurd'.*guard"),
                        ({"alias": "guard", "timeout": 0}, r"timeout"),
                        ({"alias": "guard", "endpoint": "embeddings"}, r"endpoint")):
        doc["guardrails"] = {"judged": {"judge": wrong}}
        with pytest.raises(ConfigError, match=said):
            parse(json.dumps(doc), tmp_path / "llms.json", {})
    doc["guardrails"] = {"judged": {"judge": {"alias": "guard"}, "action": "mask"}}
    with pytest.raises(ConfigError, match="a judge blocks"):
        parse(json.dumps(doc), tmp_path / "llms.json", {})
