"""A new user's first hour: README.md followed top to bottom, offline, with the shipped llms.json.

The gateway is started as `make run` starts it (`python -m gateway serve`, the shipped config, an
environment with no provider key and no gateway key), on a free port. Then every `sh` and
`python` block of the README runs as written: shell blocks through bash, in a folder holding the
config and a `.venv/bin/llms-gateway` as `make run` leaves them; Python blocks in a fresh
interpreter. Only the port changes. Each answer must be a 200 with text in it.

What cannot run here is listed in EXCEPTIONS, with why; the list is asserted short, so the README
cannot drift into commands nobody tries.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway_process import ROOT, GatewayProcess, free_port
from tests.pool_helpers import wait_for_workers

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make run`")

README = ROOT / "README.md"
# The user's shell, less any proxy of the developer's: the gateway is on loopback.
SHELL_ENV = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
SHIPPED_PORT = "localhost:8000"
# Commands of the README a test cannot run, and why. Kept short: a README is for running.
EXCEPTIONS = {
    "make run": "the install is what made this venv; the serving it then does "
                "(`python -m gateway serve` with ./llms.json) is this test's gateway",
    "make test": "the whole suite, this test among it",
}
# A curl that stands for the README's: the same arguments, then its answer's status and body
# kept for the test (a later -o / -w wins over the README's own).
CURL = """curl() {
  command curl "$@" -sS -o "$(mktemp -p "$ANSWERS" answer.XXXXXX)" -w '%{http_code}\\n' \\
    >> "$ANSWERS/statuses"
}
"""


def blocks(language: str) -> list[str]:
    """The README's fenced blocks in `language`, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)


def commands(block: str) -> list[str]:
    """A shell block's commands: continuation lines joined, a loop kept whole, comments off."""
    joined = block.replace("\\\n", " ")
    found: list[str] = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if found and ((found[-1].startswith("for ") and not found[-1].endswith("wait"))
                      or found[-1].count("'") % 2):  # inside a loop, or a quoted body
            found[-1] += "\n" + line
        elif line:
            found.append(line)
    return found


def excepted(command: str) -> bool:
    return any(command == name or command.startswith(name + " ") for name in EXCEPTIONS)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """The shipped llms.json, with only ports changed (the gateway's, the pool's workers'), in
    an environment where no provider has a key."""
    home = tmp_path_factory.mktemp("readme")
    doc: dict[str, Any] = json.loads((ROOT / "llms.json").read_text())
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.endswith(("_API_KEY", "_PROXY", "_proxy")) or name == "LLMS_GATEWAY_KEY":
                env.delenv(name)
        process = GatewayProcess(home, doc)
    doc["server"]["port"] = process.port  # `ls` finds the running gateway through it
    doc["providers"]["local"]["port"] = worker_ports(len(doc["providers"]["local"]["models"]))
    process.write_config(doc)
    process.start()
    try:
        wait_for_workers(process, "ready", count=len(doc["providers"]["local"]["models"]),
                         timeout=90)
        yield process
    finally:
        process.stop()


def worker_ports(count: int) -> int:
    """A first port for the pool's workers with the `count` ports from it free."""
    while True:
        first = free_port()
        if all(_free(first + i) for i in range(1, count)):
            return first


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@pytest.fixture(scope="module")
def folder(gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make run` leaves where the user types: ./llms.json and .venv/bin/llms-gateway."""
    here = tmp_path_factory.mktemp("checkout")
    (here / "llms.json").write_text(gateway.config_path.read_text())
    bin_dir = here / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    command = bin_dir / "llms-gateway"
    command.write_text(f"#!/bin/sh\nexec {sys.executable} -m gateway \"$@\"\n")
    command.chmod(0o755)
    return here


def test_the_readme_s_exceptions_are_few_and_each_is_in_it() -> None:
    assert len(EXCEPTIONS) <= 2
    everything = [c for block in blocks("sh") for c in commands(block)]
    for name in EXCEPTIONS:
        assert any(c == name or c.startswith(name + " ") for c in everything), name


def test_the_readme_speaks_only_of_a_model_that_answers_offline() -> None:
    shipped = json.loads((ROOT / "llms.json").read_text())["providers"]["local"]["models"]
    for block in blocks("sh") + blocks("python"):
        for model in re.findall(r"""model["']?\s*[:=]\s*["']([^"']+)""", block):
            assert model in shipped, f"{model} needs a key or a network"


@pytest.mark.parametrize("number", range(len(blocks("sh"))))
def test_each_shell_block_runs_as_written(number: int, gateway: GatewayProcess,
                                          folder: Path, tmp_path: Path) -> None:
    runnable = [c for c in commands(blocks("sh")[number]) if not excepted(c)]
    if not runnable:
        pytest.skip("only commands in EXCEPTIONS")
    script = "\n".join(runnable).replace(SHIPPED_PORT, f"localhost:{gateway.port}")
    answers = tmp_path / "answers"
    answers.mkdir()
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", CURL + script], cwd=folder,
                         env={**SHELL_ENV, "ANSWERS": str(answers)},
                         capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode == 0, f"{script}\n{run.stdout}\n{run.stderr}"
    curls = sum(len(re.findall(r"^curl ", c, re.MULTILINE)) * loops(c) for c in runnable)
    statuses = (answers / "statuses").read_text().split() if curls else []
    bodies = [json.loads(p.read_text()) for p in answers.glob("answer.*")]
    assert statuses == ["200"] * curls, bodies
    for body in bodies:
        assert body["choices"][0]["message"]["content"].strip()
    if "llms-gateway ls" in script:
        assert "gemma-3-270m" in run.stdout and "ready" in run.stdout, run.stdout


def loops(command: str) -> int:
    """How many times a command's body runs: a `for x in a b c` runs it three times."""
    match = re.match(r"for \w+ in ([^;\n]+);", command)
    return len(match.group(1).split()) if match else 1


@pytest.mark.parametrize("number", range(len(blocks("python"))))
def test_each_python_block_answers(number: int, gateway: GatewayProcess, folder: Path) -> None:
    code = blocks("python")[number].replace(SHIPPED_PORT, f"localhost:{gateway.port}")
    run = subprocess.run([sys.executable, "-c", code], cwd=folder, env=SHELL_ENV,
                         capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode == 0, f"{code}\n{run.stderr}"
    assert run.stdout.strip(), f"{code} printed no answer"


def test_the_readme_is_all_run() -> None:
    """Every block is one of the kinds above: a new kind of block must be taught to this test."""
    fences = re.findall(r"^```(\w*)$", README.read_text(), re.MULTILINE)
    languages = {f for f in fences[0::2]}
    assert languages <= {"sh", "python", "text"}, languages


DOCS = [README, ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_make_command_the_docs_give_is_one_the_makefile_has() -> None:
    """`make bench --only X` was in the docs: make took `--only` as its own option."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    variables = set(re.findall(r"^([A-Z]+) *\??=", makefile, re.MULTILINE))
    for doc in DOCS:
        for target, rest in re.findall(r"`make ([a-z][\w-]*)([^`]*)`", doc.read_text()):
            assert target in targets, f"{doc.name}: make {target}"
            for word in shlex.split(rest):  # only variables: an option would be make's own
                assert word.partition("=")[0] in variables, f"{doc.name}: make {target}{rest}"


def test_the_docs_give_the_drain_time_the_code_has() -> None:
    """The SIGTERM drain was 30 s on one page and 25 s on another: the pages say the code's."""
    from gateway.core.settings import ServerConfig
    from gateway.edge.serving import KILL_MARGIN
    from providers.kinds.pool.settings import read_settings

    server = f"{ServerConfig().drain_timeout:g}"
    said = [(path.name, seconds) for path in [*DOCS, *sorted((ROOT / "deploy").rglob("*.yaml"))]
            for seconds in re.findall(r"server\.drain_timeout`? \((\d+) s", path.read_text())]
    assert len(said) >= 4 and all(seconds == server for _, seconds in said), said
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    assert f"| `drain_timeout` | `{server}` |" in configuration
    assert f"{KILL_MARGIN} s before the server kills a worker" in configuration
    pool = read_settings({"models": {"m": {"source": "x"}}}).drain_timeout
    assert f"may finish ({pool:g} s)" in (ROOT / "docs" / "providers.md").read_text()
