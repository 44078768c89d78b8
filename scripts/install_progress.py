"""Run an install command (pip) with its output in a log file, and show where it is meanwhile.

    python3 scripts/install_progress.py --log .venv/install.log -- .venv/bin/python -m pip ...

pip's own output is ~140 lines that scroll away the one thing a new user needs to know (the first
install compiles llama.cpp for minutes), then only `still running...`. Instead: one line with the
time so far and the phase read from pip's output (resolving, downloading X, building X, installing),
updated in place on a terminal, or printed once per phase (and once a minute) when the output is
a log, as in CI. On failure, the log's last lines. Standard library only: it runs before the venv
has anything in it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import TextIO

TAIL = 40  # lines of the log shown when the command fails
TICK = 1.0  # seconds between redraws on a terminal
HEARTBEAT = 60.0  # seconds between lines when nothing changes and the output is not a terminal
# What a compile costs, said before it starts: llama.cpp from source on a 2-core machine.
# Short enough that the whole line fits in 80 columns (a cut would lose the end of it).
SLOW_BUILDS = {"llama-cpp-python": "compiles llama.cpp once: 5-20 min"}

# pip's lines, first match wins: (pattern, phase). `{0}` is the pattern's first group.
PHASES = (
    (re.compile(r"Building wheel for (\S+) \(.*\): (?:started|still running)"), "building {0}"),
    (re.compile(r"Building (?:editable|wheel) for (\S+) .*finished"), "built {0}"),
    (re.compile(r"Downloading (\S+) \((.+?)\)"), "downloading {0} ({1})"),
    (re.compile(r"Downloading (\S+)"), "downloading {0}"),
    (re.compile(r"Installing build dependencies"), "installing build dependencies"),
    (re.compile(r"(?:Getting requirements to build|Preparing (?:editable )?metadata)"),
     "preparing metadata"),
    (re.compile(r"Installing collected packages"), "installing"),
    (re.compile(r"(?:Collecting|Requirement already satisfied:|Using cached) (\S+)"),
     "resolving ({0})"),
    (re.compile(r"Obtaining "), "resolving"),  # the project itself, named by its folder
)


def phase_of(line: str) -> str | None:
    """The phase a line of pip's output starts, or None for a line that starts none."""
    for pattern, phase in PHASES:
        if match := pattern.search(line):
            name = _project(match.group(1)) if pattern.groups else ""
            said = phase.format(name, *match.groups()[1:])
            slow = SLOW_BUILDS.get(name) if said.startswith("building ") else None
            return f"{said} ({slow})" if slow else said
    return None


def _project(spec: str) -> str:
    """`llama-cpp-python[server]>=0.3.16` or `llama_cpp_python-0.3.16.tar.gz` -> the name."""
    name = spec.rsplit("/", 1)[-1]
    name = re.split(r"[\[<>=!~;( ]|-\d", name, maxsplit=1)[0]
    return name.replace("_", "-").lower()


def clock(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}:{rest:02d}"


def stage_of(phase: str) -> str:
    """What a phase is part of, for a log that gets a line per stage, not per package: resolving
    and downloading alternate package by package; each build is a stage of its own."""
    if phase.startswith(("resolving", "downloading")):
        return "resolving"
    return phase


class Display:
    """One line: redrawn in place on a terminal; in a log, a line per stage and per minute."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.terminal = out.isatty()
        self.lock = threading.Lock()  # the reader and the clock both draw
        self.stage: str | None = None
        self.printed_at = 0.0

    def show(self, elapsed: float, phase: str) -> None:
        line = f"[{clock(elapsed)}] {phase}"
        with self.lock:
            if self.terminal:
                width = shutil.get_terminal_size().columns - 1
                self.out.write("\r" + line[:width].ljust(width))
            elif stage_of(phase) != self.stage or elapsed - self.printed_at >= HEARTBEAT:
                self.out.write(line + "\n")
                self.printed_at = elapsed
            else:
                return
            self.stage = stage_of(phase)
            self.out.flush()

    def end(self) -> None:
        if self.terminal and self.stage is not None:
            self.out.write("\n")
            self.out.flush()


def run(command: list[str], log: Path, out: TextIO) -> int:
    """Run `command` with its output in `log`; show its phase on `out`; its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    phase = ["starting"]
    tail: deque[str] = deque(maxlen=TAIL)
    started = time.monotonic()
    display = Display(out)
    with log.open("w") as written:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", bufsize=1,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None

        def read() -> None:  # a thread, so the clock moves while pip prints nothing
            assert process.stdout is not None
            for line in process.stdout:
                written.write(line)
                written.flush()
                tail.append(line.rstrip("\n"))
                if (now := phase_of(line)) is not None and now != phase[0]:
                    phase[0] = now
                    display.show(time.monotonic() - started, now)

        display.show(0.0, phase[0])
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        while reader.is_alive():
            display.show(time.monotonic() - started, phase[0])
            reader.join(TICK)
        status = process.wait()
    elapsed = time.monotonic() - started
    display.show(elapsed, "done" if status == 0 else f"failed (exit status {status})")
    display.end()
    if status != 0:
        out.write(f"The last {len(tail)} lines of {log}:\n")
        out.writelines(f"  {line}\n" for line in tail)
        out.flush()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log", type=Path, required=True, help="where the command's output goes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    print(f"(the full output goes to {args.log})", flush=True)
    return run(command, args.log, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
