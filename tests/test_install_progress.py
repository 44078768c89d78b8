"""`make run`'s first install: what the user sees during pip's long, quiet compile.

scripts/install_progress.py runs against a stand-in for pip that prints pip's own lines (as
pip 25 prints them installing `.[local]`), so no test compiles llama.cpp.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.gateway_process import ROOT

SCRIPT = ROOT / "scripts" / "install_progress.py"


def script() -> ModuleType:
    """The script as a module (scripts/ is not a package: it runs before anything is installed)."""
    spec = importlib.util.spec_from_file_location("install_progress", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PIP_LINES = """\
Obtaining file:///work/llms-gateway
  Installing build dependencies: started
  Installing build dependencies: finished with status 'done'
  Checking if build backend supports build_editable: started
  Getting requirements to build editable: started
  Preparing editable metadata (pyproject.toml): started
Collecting litestar<3,>=2.25 (from llms-gateway==0.1.0)
  Downloading litestar-2.25.0-py3-none-any.whl.metadata (29 kB)
Collecting llama-cpp-python>=0.3.16 (from llama-cpp-python[server]>=0.3.16; extra == "local")
  Downloading llama_cpp_python-0.3.16.tar.gz (50.7 MB)
Requirement already satisfied: pip in ./.venv/lib/python3.11/site-packages (25.2)
Building wheels for collected packages: llms-gateway, llama-cpp-python
  Building editable for llms-gateway (pyproject.toml): started
  Building editable for llms-gateway (pyproject.toml): finished with status 'done'
  Building wheel for llama-cpp-python (pyproject.toml): started
  Building wheel for llama-cpp-python (pyproject.toml): still running...
  Building wheel for llama-cpp-python (pyproject.toml): finished with status 'done'
Successfully built llms-gateway llama-cpp-python
Installing collected packages: litestar, llama-cpp-python, llms-gateway
Successfully installed litestar-2.25.0 llama-cpp-python-0.3.16 llms-gateway-0.1.0
"""
FAILURE = """\
  Building wheel for llama-cpp-python (pyproject.toml): started
  Building wheel for llama-cpp-python (pyproject.toml): finished with status 'error'
  error: subprocess-exited-with-error
  CMake Error at CMakeLists.txt:3 (project):
    No CMAKE_CXX_COMPILER could be found.
ERROR: Failed to build installable wheels for some pyproject.toml based projects
"""


def fake_pip(tmp_path: Path, lines: str, status: int) -> list[str]:
    """A command that prints `lines` as pip would (one write each), then exits with `status`."""
    (tmp_path / "pip.txt").write_text(lines)
    code = ("import sys\n"
            f"for line in open({str(tmp_path / 'pip.txt')!r}):\n"
            "    sys.stdout.write(line); sys.stdout.flush()\n"
            f"sys.exit({status})\n")
    return [sys.executable, "-c", code]


def install(tmp_path: Path, lines: str, status: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--log", str(tmp_path / "install.log"),
                           "--", *fake_pip(tmp_path, lines, status)],
                          capture_output=True, text=True, timeout=60, check=False)


def test_each_phase_of_the_install_is_one_line_with_the_time(tmp_path: Path) -> None:
    run = install(tmp_path, PIP_LINES, 0)
    assert run.returncode == 0, run.stdout + run.stderr
    said = [line.split("] ", 1)[1] for line in run.stdout.splitlines()[1:]]
    assert all(line.startswith("[0:") for line in run.stdout.splitlines()[1:]), run.stdout
    assert said == ["starting", "resolving", "installing build dependencies",
                    "preparing metadata",
                    "resolving (litestar)", "built llms-gateway",
                    "building llama-cpp-python (compiles llama.cpp once: 5-20 min)",
                    "built llama-cpp-python", "installing", "done"]
    assert len(run.stdout.splitlines()) < 20, "pip's 20 lines are not repeated"
    assert (tmp_path / "install.log").read_text() == PIP_LINES


def test_the_compile_is_named_with_its_typical_time_while_it_runs() -> None:
    phase_of = script().phase_of
    said = [phase_of(line) for line in PIP_LINES.splitlines()]
    assert "building llama-cpp-python (compiles llama.cpp once: 5-20 min)" in said
    assert "downloading llama-cpp-python (50.7 MB)" in said
    assert "resolving (llama-cpp-python)" in said
    assert said[-2:] == ["installing", None]
    started, running = (f"  Building wheel for llama-cpp-python (pyproject.toml): {state}"
                        for state in ("started", "still running..."))
    assert phase_of(running) == phase_of(started)


def test_a_failed_install_shows_the_log_s_tail_and_keeps_pip_s_status(tmp_path: Path) -> None:
    run = install(tmp_path, PIP_LINES.split("  Building wheel")[0] + FAILURE, 1)
    assert run.returncode == 1
    assert "failed (exit status 1)" in run.stdout
    tail = run.stdout.split(f"lines of {tmp_path / 'install.log'}:\n", 1)[1]
    assert "No CMAKE_CXX_COMPILER could be found." in tail
    assert tail.splitlines()[-1].strip().startswith("ERROR: Failed to build")


def test_on_a_terminal_the_line_is_redrawn_in_place(tmp_path: Path) -> None:
    """Under a pseudo-terminal: carriage returns, no line per phase, one newline at the end."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--log", str(tmp_path / "install.log"), "--",
         *fake_pip(tmp_path, PIP_LINES, 0)],
        stdout=follower, stderr=follower, env={**os.environ, "COLUMNS": "120"})
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other side closed: the script has exited
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0
    text = shown.decode().replace("\r\n", "\n")  # the terminal's own newline translation
    drawn = text.split("\n", 1)[1]  # after the line naming the log
    assert "\r[0:" in drawn and "] done" in drawn.rsplit("\r", 1)[1]
    assert drawn.count("\n") == 1, "one line, redrawn"


def test_the_compile_s_line_fits_an_80_column_terminal_whole() -> None:
    progress = script()
    for name, slow in progress.SLOW_BUILDS.items():
        line = f"[59:59] building {name} ({slow})"
        assert len(line) < 80, line
