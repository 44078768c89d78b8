"""Guardrails' names and places: a named-entity model (Presidio on spaCy's small English model,
the `ner` extra) finds the people and places of a prompt, off the event loop; the provider
sees `[PERSON_1]` while the user reads the name back, whole and streamed.

One gateway, its aliases each behind a policy of llms.json, one fake upstream that records
what it was sent and echoes the prompt back.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from gateway.core.settings.guardrails import GuardrailPolicy
from gateway.guardrails.entities import EntitiesUnread, Models
from gateway.guardrails.policies import compiled
from gateway.guardrails.screening import Screening
from tests.gateway_process import ROOT, GatewayProcess, config, free_port, provider, wait_until
from tests.upstream import FakeUpstream, echo_prompt

PROMPT = "Please write to Alice Johnson in Paris about the invoice."
EMAIL = "alice@example.com"
GUARDRAILS = {
    "names": {"detect": ["person", "location", "email"], "action": "pseudonymize"},
    "masked": {"detect": ["person"], "action": "mask"},
    "no-names": {"detect": ["person"], "action": "block"},
    "short": {"detect": ["person"], "action": "mask", "ner": {"max_chars": 100}},
    "hasty": {"detect": ["person"], "action": "mask", "ner": {"timeout": 0.001}},
}
ALIASES = {"names-model": ["names"], "mask-model": ["masked"], "block-model": ["no-names"],
           "short-model": ["short"], "hasty-model": ["hasty"]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="named") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, upstream: FakeUpstream
            ) -> Iterator[GatewayProcess]:
    doc = config({"main": provider(upstream.base_url, {alias: alias for alias in ALIASES})},
                 defaults={"circuit": {"enabled": False}})
    doc["guardrails"] = GUARDRAILS
    doc["models"] = {alias: {"guardrails": names} for alias, names in ALIASES.items()}
    process = GatewayProcess(tmp_path_factory.mktemp("names"), doc)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def client(gateway: GatewayProcess, upstream: FakeUpstream) -> openai.OpenAI:
    upstream.reset()
    upstream.set_mode(echo_prompt(20))  # streamed, "[PERSON_1]" split in two deltas
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def _said(client: openai.OpenAI, model: str, prompt: str) -> tuple[str, str, str]:
    """What the user reads back, whole and streamed, and the `x-llms-guardrails` header."""
    whole = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}])
    streamed = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    return whole.parse().choices[0].message.content or "", text, \
        whole.headers["x-llms-guardrails"]


def test_the_provider_sees_placeholders_for_names_and_places_and_the_user_reads_them_back(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    prompt = f"{PROMPT} Tell Alice Johnson to reply to {EMAIL}."

    whole, streamed, header = _said(client, "names-model", prompt)

    assert [r.json["messages"][0]["content"] for r in upstream.requests] == [
        "Please write to [PERSON_1] in [LOCATION_1] about the invoice. Tell [PERSON_1] to "
        "reply to [EMAIL_1]."] * 2
    assert all(name not in r.body.decode() for r in upstream.requests
               for name in ("Alice", "Paris", EMAIL))
    assert whole == streamed == prompt
    assert header == "pseudonymize:names=4"


def test_masked_names_stay_masked_and_a_blocking_policy_refuses_a_name(
        client: openai.OpenAI, upstream: FakeUpstream) -> None:
    whole, streamed, header = _said(client, "mask-model", PROMPT)

    masked = "Please write to [PERSON] in Paris about the invoice."
    assert upstream.last_json["messages"][0]["content"] == masked
    assert whole == streamed == masked and header == "mask:masked=1"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="block-model",
                                       messages=[{"role": "user", "content": PROMPT}])
    assert refused.value.code == "guardrail_violation"
    assert "'no-names'" in refused.value.message and "PERSON" in refused.value.message
    assert "Alice" not in refused.value.message
    assert client.chat.completions.create(
        model="block-model", messages=[{"role": "user", "content": "What is an invoice?"}]
    ).choices[0].message.content == "What is an invoice?"


def test_a_text_over_the_bound_or_a_look_over_its_timeout_is_refused_unsent(
        client: openai.OpenAI, upstream: FakeUpstream, gateway: GatewayProcess) -> None:
    long = PROMPT * 2  # 114 characters, over "short"'s 100
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="short-model",
                                       messages=[{"role": "user", "content": long}])
    assert refused.value.code == "guardrail_violation"
    assert "over the 100 characters read for names and places" in refused.value.message
    with pytest.raises(openai.BadRequestError) as slow:  # no model reads 2 KB in 1 ms
        client.chat.completions.create(model="hasty-model",
                                       messages=[{"role": "user", "content": PROMPT * 36}])
    assert "not read for names and places within 0.001s" in slow.value.message
    assert upstream.requests == []
    wait_until(lambda: len(gateway.log_events("guardrail_ner_unread")) >= 2,
               what="both refusals logged")
    unread = [(line["guardrail"], line["reason"])
              for line in gateway.log_events("guardrail_ner_unread")][-2:]
    assert unread == [("short", "over the 100 characters read for names and places"),
                      ("hasty", "not read for names and places within 0.001s")]
    assert "Alice" not in gateway.logs()
    assert client.chat.completions.create(
        model="short-model", messages=[{"role": "user", "content": PROMPT}]
    ).choices[0].message.content == "Please write to [PERSON] in Paris about the invoice."


def test_the_model_reads_in_its_worker_thread_and_finds_people_and_places() -> None:
    models = Models()
    guardrail = compiled("names", GuardrailPolicy(detect=("person", "location"),
                                                  action="pseudonymize"), models)
    assert guardrail.entities is not None
    text = "John Smith flew from Berlin to Lisbon with Maria Garcia."
    worker = Screening(off_loop=True)

    screened = asyncio.run(models.off_loop(lambda: worker.screened(text, [guardrail], "input"),
                                           [guardrail.entities], len(text)))

    assert screened == "[PERSON_1] flew from [LOCATION_1] to [LOCATION_2] with [PERSON_2]."
    assert worker.restored(screened) == text
    with pytest.raises(EntitiesUnread, match="over the 20000 characters"):
        asyncio.run(models.off_loop(lambda: None, [guardrail.entities], 20_001))
    # On the event loop (an MCP tool call's screening), no model runs: the regexes alone.
    assert Screening().screened(text, [guardrail], "input") == text


def test_asking_for_names_without_the_extra_or_its_model_is_a_config_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = config({"main": provider("http://127.0.0.1:9/v1", {"m": "m"})})
    doc["guardrails"] = {"names": {"detect": ["email", "person"], "action": "mask"}}
    assert parse(json.dumps(doc), tmp_path / "llms.json", {}).guardrails["names"].sides == \
        ("input",)
    for policy, said in (
            ({"ner": {"model": "en_core_web_nowhere"}},
             r"guardrails\[\.\.\.\]: ner\.model: no spaCy model package named "
             "'en_core_web_nowhere'"),
            ({"phases": ["input", "output"]}, r"'person' is looked for in requests only"),
            ({"detect": ["email"], "ner": {}}, r"ner: only with `detect`")):
        doc["guardrails"] = {"names": {"detect": ["person"], "action": "mask", **policy}}
        with pytest.raises(ConfigError, match=said):
            parse(json.dumps(doc), tmp_path / "llms.json", {})
    monkeypatch.setitem(sys.modules, "presidio_analyzer", None)  # as if never installed
    doc["guardrails"] = {"names": {"detect": ["location"], "action": "pseudonymize"}}
    with pytest.raises(ConfigError, match=r"guardrails\[\.\.\.\]: detect: 'location' needs the "
                                          r"`ner` extra, not installed: pip install "
                                          r"'llms-gateway\[ner\]'"):
        parse(json.dumps(doc), tmp_path / "llms.json", {})


def test_a_gateway_whose_policies_never_ask_for_names_loads_no_model(tmp_path: Path) -> None:
    doc = config({"main": provider("http://127.0.0.1:9/v1", {"m": "m"})})
    doc["guardrails"] = {"pii": {"detect": ["email", "phone"], "action": "pseudonymize"}}
    doc["models"] = {"m": {"guardrails": ["pii"]}}
    (tmp_path / "llms.json").write_text(json.dumps(doc))
    script = (
        "import sys; from pathlib import Path\n"
        "from gateway.config.loader import parse\n"
        "from gateway.guardrails.policies import Guardrails\n"
        f"path = Path({str(tmp_path / 'llms.json')!r})\n"
        "Guardrails(parse(path.read_text(), path, {}))\n"
        "print(sorted(m for m in ('spacy', 'presidio_analyzer') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_a_gateway_asked_for_names_without_the_extra_refuses_to_start_saying_so(
        tmp_path: Path) -> None:
    doc = config({"main": provider("http://127.0.0.1:9/v1", {"m": "m"})})
    doc["guardrails"] = {"names": {"detect": ["person"], "action": "pseudonymize"}}
    (tmp_path / "llms.json").write_text(json.dumps(doc))
    script = ("import sys\n"
              "sys.modules['presidio_analyzer'] = None  # as on a machine without the extra\n"
              "from gateway.cli import main\n"
              f"sys.exit(main(['serve', '--config', {str(tmp_path / 'llms.json')!r}, "
              f"'--host', '127.0.0.1', '--port', '{free_port()}']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "invalid config" in done.stderr
    assert "detect: 'person' needs the `ner` extra, not installed: pip install " \
           "'llms-gateway[ner]'" in done.stderr
