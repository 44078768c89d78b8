"""docs/quickstart.md followed by a user with OpenAI and Anthropic keys, a vLLM and an Ollama.

Its `llms.json` block is the gateway's config with only where the upstreams are changed: each
provider points at a fake of its kind on a real socket (OpenAI's and vLLM's `FakeUpstream`,
`FakeAnthropic`, `FakeOllama`), a remote API at the fake's loopback address, a local server at
the fake's port on its own host. Those hosts are unknown to genai-prices, so each model gets
the price genai-prices gives it at the doc's own URL. The gateway runs behind a proxy that is
down, with the `NO_PROXY` the doc exports, as a user on a corporate network would.

Then every block runs as written, only the port changed: shell blocks through bash, in a folder
holding the config and with `llms-gateway` on `PATH`; the Python block in a fresh interpreter;
Claude Code's block with the CLI `make test` installs (skipped without it); Continue's YAML read
and its models asked. The team's keys get a gateway of their own: a key, once made, locks the
gateway to keys, as the doc warns.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import msgspec
import openai
import pytest
import yaml

from gateway.core.facts import facts
from providers.contract.spec import ModelEntry
from tests.fake_anthropic import FakeAnthropic
from tests.fake_ollama import FakeOllama
from tests.gateway_process import ROOT, GatewayProcess, free_port, wait_until
from tests.upstream import FakeUpstream, status

QUICKSTART = ROOT / "docs" / "quickstart.md"
README = ROOT / "README.md"
SHIPPED_PORT = "localhost:8000"
# The user's shell, less any proxy of the developer's: the gateway is on loopback.
SHELL_ENV = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
# Each shell block is one step of the user's story, found by a command only it has.
STORIES = {"start": "llms-gateway serve", "call": "curl ", "claude_code": "claude -p",
           "team": "llms-gateway keys create"}
# Commands of the doc a test cannot run as written, and why.
EXCEPTIONS = {
    "llms-gateway serve": "it runs until stopped: the test's gateway is this command with this "
                          "file and the environment the block exports",
}
FAKES: dict[str, type[FakeUpstream]] = {"openai": FakeUpstream, "anthropic": FakeAnthropic,
                                        "ollama": FakeOllama}
CLAUDE = ROOT / "tests" / "node" / "node_modules" / ".bin" / "claude"
# As a curl of the doc's, kept for the test: its status, and its body in a file of its own.
CURL = """curl() {
  command curl "$@" -sS -o "$(mktemp -p "$ANSWERS" answer.XXXXXX)" -w '%{http_code}\\n' \\
    >> "$ANSWERS/statuses"
}
"""


def blocks(language: str) -> list[str]:
    """The quickstart's fenced blocks in `language`, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", QUICKSTART.read_text(),
                      re.MULTILINE | re.DOTALL)


def block(story: str) -> str:
    """The one shell block of a step of the story."""
    (found,) = [b for b in blocks("sh") if STORIES[story] in b]
    return found


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments off."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()
        if line:
            found.append(line)
    return found


def runnable(story: str, gateway: GatewayProcess) -> str:
    """A step's block as a script: its commands but the excepted, on the gateway's port."""
    kept = [c for c in commands(block(story))
            if not any(c == name or c.startswith(name + " ") for name in EXCEPTIONS)]
    return "\n".join(kept).replace(SHIPPED_PORT, f"localhost:{gateway.port}")


def the_config() -> dict[str, Any]:
    (text,) = blocks("json")
    doc: dict[str, Any] = json.loads(text)
    return doc


# The alias the Python block asks: the one served by OpenAI, then Anthropic.
ASKED = re.findall(r'model="([^"]+)"', blocks("python")[0])[0]


# --- the config, pointed at fakes -------------------------------------------------------------


def at_fake(url: str, fake: FakeUpstream) -> str:
    """`url` at the fake: a remote API's host becomes the fake's loopback address; a local
    server keeps its host (`localhost`) and takes the fake's port."""
    parts = urlsplit(url)
    host = parts.hostname if parts.hostname in ("localhost", "127.0.0.1") else "127.0.0.1"
    return urlunsplit(("http", f"{host}:{fake.port}", parts.path, "", ""))


def priced_as_at(url: str, models: dict[str, Any]) -> dict[str, Any]:
    """`models` with the price genai-prices gives each at `url` written out (the fakes' hosts
    have no price), those llms.json prices itself kept."""
    written = {}
    for alias, entry in models.items():
        model = msgspec.convert(entry if isinstance(entry, dict) else {"id": entry}, ModelEntry)
        price = facts(model, url).price
        written[alias] = {**({"id": entry} if isinstance(entry, str) else entry),
                          "price": {k: v for k, v in msgspec.structs.asdict(price).items()
                                    if v is not None}}
    return written


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    """One fake per provider of the doc, of its kind, answering "Hello from NAME"."""
    with ExitStack() as stack:
        yield {name: stack.enter_context(FAKES[entry["type"]](name=name))
               for name, entry in the_config()["providers"].items()}


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> None:
    for fake in fakes.values():
        fake.reset()


def pointed_at(fakes: dict[str, FakeUpstream]) -> dict[str, Any]:
    doc = the_config()
    for name, entry in doc["providers"].items():
        url = entry["base_url"]
        entry["base_url"] = at_fake(url, fakes[name])
        entry["models"] = priced_as_at(url, entry["models"])
    return doc


def exported(story: str, name: str) -> str:
    """What a step's block exports as `name`."""
    (value,) = re.findall(rf"^export {name}=(\S+)", block(story), re.MULTILINE)
    return value


def behind_a_dead_proxy(no_proxy: str | None) -> dict[str, str]:
    """A corporate network's environment whose proxy is down, with this NO_PROXY."""
    proxy = f"http://127.0.0.1:{free_port()}"
    return {"HTTPS_PROXY": proxy, "HTTP_PROXY": proxy,
            **({"NO_PROXY": no_proxy} if no_proxy is not None else {})}


def serve(workdir: Path, doc: dict[str, Any], env: dict[str, str]) -> GatewayProcess:
    """`llms-gateway serve` with this llms.json, which says where it listens (for the CLI)."""
    process = GatewayProcess(workdir, doc, env={"OPENAI_API_KEY": "sk-test-openai-0000",
                                                "ANTHROPIC_API_KEY": "sk-ant-test-0000",
                                                **env})
    doc.setdefault("server", {})["port"] = process.port
    process.write_config(doc)
    return process.start()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    process = serve(tmp_path_factory.mktemp("quickstart"), pointed_at(fakes),
                    behind_a_dead_proxy(exported("start", "NO_PROXY")))
    yield process
    process.stop()


def checkout(gateway: GatewayProcess, where: Path) -> dict[str, str]:
    """Where the user types: ./llms.json, and `llms-gateway` on PATH (in .venv/bin, as `make
    run` leaves it). The shell's environment."""
    (where / "llms.json").write_text(gateway.config_path.read_text())
    bin_dir = where / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    command = bin_dir / "llms-gateway"
    command.write_text(f"#!/bin/sh\nexec {sys.executable} -m gateway \"$@\"\n")
    command.chmod(0o755)
    return {**SHELL_ENV, "PATH": f"{bin_dir}:{SHELL_ENV.get('PATH', '/usr/bin:/bin')}"}


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, f"{script}\n{run.stdout}\n{run.stderr}"
    return run


def python_block(gateway: GatewayProcess, key: str | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """The doc's Python block in a fresh interpreter, on the gateway's port (with `key` where
    it says `not-needed`)."""
    code = blocks("python")[0].replace(SHIPPED_PORT, f"localhost:{gateway.port}")
    if key is not None:
        code = code.replace('"not-needed"', json.dumps(key))
    return subprocess.run([sys.executable, "-c", code], env=SHELL_ENV, capture_output=True,
                          text=True, timeout=120, check=False)


def answered(gateway: GatewayProcess) -> str:
    run = python_block(gateway)
    assert run.returncode == 0, f"{run.stderr}\n{gateway.logs()[-3000:]}"
    return run.stdout.strip()


def asked(fake: FakeUpstream) -> list[str]:
    """The upstream models a fake was asked for, in order."""
    return [r.json["model"] for r in fake.requests if r.method == "POST"]


def served_by(provider: str, *aliases: str) -> list[str]:
    """The upstream ids `provider` gives `aliases`, in order, skipping those it does not serve."""
    models = the_config()["providers"][provider]["models"]
    return [m if isinstance(m, str) else m["id"]
            for m in (models[a] for a in aliases if a in models)]


# --- the doc is all run ---------------------------------------------------------------------


def test_every_block_of_the_quickstart_is_one_a_test_runs() -> None:
    """A new block, or a new kind of block, must be taught to this test."""
    fences = re.findall(r"^```(\w*)$", QUICKSTART.read_text(), re.MULTILINE)[0::2]
    assert Counter(fences) == {"json": 1, "python": 1, "yaml": 1, "sh": len(STORIES)}, fences
    for text in blocks("sh"):
        assert [story for story, command in STORIES.items() if command in text], text
    for story in STORIES:
        block(story)  # one block each
    assert len(EXCEPTIONS) == 1
    assert all(any(c.startswith(name) for c in commands(block("start"))) for name in EXCEPTIONS)


def test_the_readme_links_the_quickstart_before_any_other_doc() -> None:
    first = re.search(r"\]\(((?:docs|bench)/[^)]+)\)", README.read_text())
    assert first is not None and first.group(1) == "docs/quickstart.md"


def test_the_config_serves_one_alias_from_openai_then_anthropic_with_fallbacks() -> None:
    doc = the_config()
    providers = list(doc["providers"])
    assert providers.index("openai") < providers.index("anthropic")
    assert ASKED in doc["providers"]["openai"]["models"]
    assert ASKED in doc["providers"]["anthropic"]["models"]
    assert doc["models"][ASKED]["fallbacks"]
    assert {e["type"] for e in doc["providers"].values()} == {"openai", "anthropic", "ollama"}


# --- 2. start it and call it ------------------------------------------------------------------


def test_the_start_block_runs_but_for_serve_which_is_the_test_s_gateway(
        gateway: GatewayProcess, tmp_path: Path) -> None:
    bash(runnable("start", gateway), tmp_path, checkout(gateway, tmp_path))


def test_the_curl_block_answers_and_ls_lists_the_providers_in_order(
        gateway: GatewayProcess, tmp_path: Path) -> None:
    answers = tmp_path / "answers"
    answers.mkdir()
    script = runnable("call", gateway)
    run = bash(CURL + script, tmp_path, {**checkout(gateway, tmp_path), "ANSWERS": str(answers)})
    assert (answers / "statuses").read_text().split() == ["200"] * script.count("curl ")
    for body in answers.glob("answer.*"):
        assert json.loads(body.read_text())["choices"][0]["message"]["content"].startswith(
            "Hello from openai")
    enabled = re.findall(r"^\s*\d+\. (\S+)\s+\S+\s+enabled$", run.stdout, re.MULTILINE)
    assert enabled == list(the_config()["providers"]), run.stdout  # in file order


def test_the_python_block_is_answered_by_openai(gateway: GatewayProcess,
                                                fakes: dict[str, FakeUpstream]) -> None:
    assert answered(gateway) == "openai answered: Hello from openai"
    assert asked(fakes["openai"]) == served_by("openai", ASKED)
    assert asked(fakes["anthropic"]) == []


# --- 3. Claude Code, Continue ---------------------------------------------------------------


def test_claude_code_answers_through_the_gateway(gateway: GatewayProcess,
                                                 tmp_path: Path) -> None:
    if not CLAUDE.exists():
        pytest.skip("Claude Code is not installed: `make test` installs it with npm into "
                    "tests/node")
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    # Only what the block sets, and nothing but the gateway: no telemetry, reports or updates.
    env = {"PATH": f"{CLAUDE.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": str(home), "CLAUDE_CONFIG_DIR": str(home / ".claude"),
           "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    before = len(gateway.log_events("request"))
    script = runnable("claude_code", gateway)
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=home / "project",
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=150, check=False)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{gateway.logs()[-2000:]}"
    assert "Hello from openai" in run.stdout
    main = wait_until(lambda: [e for e in gateway.log_events("request")[before:]
                               if e.get("endpoint") == "messages" and e.get("model") == ASKED],
                      what="Claude Code's request for the alias in the gateway's log")
    assert {e["status"] for e in main} == {200}


def test_continue_s_models_are_the_gateway_s_aliases_and_answer(gateway: GatewayProcess) -> None:
    (text,) = blocks("yaml")
    models = yaml.safe_load(text)["models"]
    served = {alias for entry in the_config()["providers"].values() for alias in entry["models"]}
    assert models and {m["model"] for m in models} <= served
    for model in models:
        assert (model["provider"], model["apiBase"]) == ("openai", f"http://{SHIPPED_PORT}/v1")
        client = openai.OpenAI(base_url=model["apiBase"].replace(SHIPPED_PORT,
                                                                 f"localhost:{gateway.port}"),
                               api_key=model["apiKey"], max_retries=0)
        reply = client.chat.completions.create(
            model=model["model"], messages=[{"role": "user", "content": "Hello!"}])
        assert reply.choices[0].message.content.startswith("Hello from")


# --- 4. keys for a small team -------------------------------------------------------------


@pytest.fixture
def team_gateway(tmp_path: Path, fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    """A gateway of its own, as the quickstart's: a key made locks it to keys."""
    (tmp_path / "team").mkdir()
    process = serve(tmp_path / "team", pointed_at(fakes),
                    behind_a_dead_proxy(exported("start", "NO_PROXY")))
    yield process
    process.stop()


def test_five_commands_make_keys_that_work_within_their_models(
        team_gateway: GatewayProcess, tmp_path: Path) -> None:
    here = tmp_path / "checkout"
    here.mkdir()
    env = checkout(team_gateway, here)
    run = bash(runnable("team", team_gateway), here, env)
    made = dict(re.findall(r"^Created key (\S+) \((\w+)", run.stdout, re.MULTILINE))
    secrets = re.findall(r"^\s+(sk-llms-\S+)$", run.stdout, re.MULTILINE)
    assert sorted(made.values()) == ["alice", "bob"] and len(secrets) == 2, run.stdout
    alice, bob = (secrets[list(made.values()).index(name)] for name in ("alice", "bob"))
    listed = dict(re.findall(r"^(key_\S+)\s+(\w+)\s+sk-llms-", run.stdout, re.MULTILINE))
    assert listed == made, run.stdout  # `keys list`: both, by their hints, never the secrets

    # Alice's key answers the doc's own Python block; without a key it is now a 401.
    run_alice = python_block(team_gateway, alice)
    assert run_alice.returncode == 0, run_alice.stderr
    assert run_alice.stdout.strip() == "openai answered: Hello from openai"
    locked = python_block(team_gateway)
    assert locked.returncode != 0 and "401" in locked.stderr, locked.stderr
    # Bob's key may use only his --models.
    refused = httpx.post(f"{team_gateway.base_url}/chat/completions",
                         headers={"Authorization": f"Bearer {bob}"}, json={
                             "model": ASKED, "messages": [{"role": "user", "content": "Hi"}]})
    assert refused.status_code == 403, refused.text

    alice_id = next(key_id for key_id, name in made.items() if name == "alice")
    spend = [c for c in commands(block("team")) if c.startswith("llms-gateway spend")]
    wait_until(lambda: alice_id in bash("\n".join(spend), here, env).stdout,
               what="alice's request in `llms-gateway spend`")


# --- when providers fail ----------------------------------------------------------------------


def test_with_openai_failing_the_same_block_is_answered_by_anthropic(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["openai"].set_mode(status(500, "The server had an error"))
    assert answered(gateway) == "anthropic answered: Hello from anthropic"
    assert asked(fakes["openai"]) == served_by("openai", ASKED)
    assert asked(fakes["anthropic"]) == served_by("anthropic", ASKED)


def test_with_both_failing_the_fallback_aliases_answer_in_order(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["openai"].set_mode(status(500, "The server had an error"))
    fakes["anthropic"].set_mode(status(529, body=json.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})))
    chain = [ASKED, *the_config()["models"][ASKED]["fallbacks"]]  # smart, fast, local

    assert answered(gateway) == "vllm answered: Hello from vllm"
    assert asked(fakes["openai"]) == served_by("openai", *chain)  # smart, then fast
    assert asked(fakes["anthropic"]) == served_by("anthropic", *chain)
    assert asked(fakes["vllm"]) == served_by("vllm", *chain)  # local


def test_the_local_alias_is_vllm_then_ollama(gateway: GatewayProcess,
                                             fakes: dict[str, FakeUpstream]) -> None:
    for name in ("openai", "anthropic", "vllm"):
        fakes[name].set_mode(status(503, "down"))
    assert answered(gateway) == "ollama answered: Hello from ollama"
    assert asked(fakes["ollama"]) == served_by("ollama", "local")


def test_without_no_proxy_the_local_servers_are_asked_through_the_proxy_and_fail(
        tmp_path: Path, fakes: dict[str, FakeUpstream]) -> None:
    """The caveat the doc explains: with a proxy set, loopback is not direct by default."""
    doc = pointed_at(fakes)
    doc["providers"] = {k: v for k, v in doc["providers"].items() if k in ("vllm", "ollama")}
    doc["models"] = {}
    process = serve(tmp_path, doc, behind_a_dead_proxy(None))
    try:
        answer = httpx.post(f"{process.base_url}/chat/completions", timeout=30, json={
            "model": "local", "messages": [{"role": "user", "content": "Hello!"}]})
    finally:
        process.stop()
    assert answer.status_code >= 500, answer.text
    assert "proxy" in answer.text
    assert asked(fakes["vllm"]) == asked(fakes["ollama"]) == []
