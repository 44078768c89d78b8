"""What each stage of a Dockerfile leaves on disk and who owns it, read without a container engine.

`dockerfile-parse` splits the file into instructions; this follows the few that make paths and
users and say where the process writes: WORKDIR, COPY/ADD (`--chown`), USER, ENV, VOLUME, and in
RUN the commands that do it here (`useradd --create-home`, `mkdir`, `install -d -o`, `chown`).
Anything else a RUN does is not seen: a path it makes is reported missing, which errs on the
side of a failed check.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

ROOT_USER = "root"


@dataclass
class Stage:
    """One `FROM ... AS name` and what its instructions made."""

    name: str
    base: str
    user: str = ROOT_USER  # who the image runs as (the last USER)
    uids: dict[str, int] = field(default_factory=dict)  # users made with `useradd --uid`
    owners: dict[str, str] = field(default_factory=dict)  # path -> owning user
    env: dict[str, str] = field(default_factory=dict)  # what ENV set, as the process sees it
    volumes: list[str] = field(default_factory=list)  # what VOLUME declared
    workdir: str = "/"

    def owner(self, path: str) -> str | None:
        """Who owns `path` (made itself, or under a directory copied whole), or None."""
        path = posixpath.normpath(path)
        while True:
            if path in self.owners:
                return self.owners[path]
            if path == "/":
                return None
            path = posixpath.dirname(path)

    def made(self, path: str) -> bool:
        return posixpath.normpath(path) in self.owners


def stages(dockerfile: Path | str) -> dict[str, Stage]:
    """Every named stage of the file, in order."""
    text = dockerfile.read_text() if isinstance(dockerfile, Path) else dockerfile
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    found: dict[str, Stage] = {}
    stage: Stage | None = None
    for instruction in parser.structure:
        kind, value = instruction["instruction"], instruction["value"]
        if kind == "FROM":
            base, _, name = value.partition(" AS ")
            stage = found[name.strip()] = Stage(name.strip(), base.strip())
        elif stage is not None:
            _follow(stage, kind, value)
    return found


def _follow(stage: Stage, kind: str, value: str) -> None:
    if kind == "WORKDIR":
        stage.workdir = _absolute(stage, value.strip())
        stage.owners.setdefault(stage.workdir, ROOT_USER)
    elif kind == "ENV":
        words = shlex.split(value)
        if words and "=" not in words[0]:  # the old form: `ENV NAME the rest`
            stage.env[words[0]] = value.split(None, 1)[1].strip()
        else:
            for word in words:
                name, _, setting = word.partition("=")
                stage.env[name] = setting
    elif kind == "VOLUME":
        stage.volumes += json.loads(value) if value.startswith("[") else value.split()
    elif kind == "USER":
        stage.user = value.strip().split(":")[0]
    elif kind in ("COPY", "ADD"):
        words = shlex.split(value)
        flags = [w for w in words if w.startswith("--")]
        chown = next((f.split("=", 1)[1] for f in flags if f.startswith("--chown=")), ROOT_USER)
        owner = chown.split(":")[0]
        sources, target = [w for w in words if not w.startswith("--")][:-1], words[-1]
        into_directory = target.endswith("/") or len(sources) > 1
        target = _absolute(stage, target)
        if into_directory:  # one path per source
            for source in sources:
                stage.owners[posixpath.join(target, posixpath.basename(source))] = owner
        stage.owners[posixpath.normpath(target)] = owner
    elif kind == "RUN":
        for command in re.split(r"&&|;|\|\|", value):
            _run(stage, shlex.split(command.replace("\\\n", " ")))


def _run(stage: Stage, words: list[str]) -> None:
    if not words:
        return
    program, args = words[0], words[1:]
    if program == "useradd":
        name = args[-1]
        if "--uid" in args:
            stage.uids[name] = int(args[args.index("--uid") + 1])
        if "--create-home" in args or "-m" in args:
            stage.owners[f"/home/{name}"] = name
    elif program == "mkdir":
        for path in (a for a in args if not a.startswith("-")):
            stage.owners[_absolute(stage, path)] = ROOT_USER
    elif program == "install" and "-d" in args:
        owner = args[args.index("-o") + 1] if "-o" in args else ROOT_USER
        skip = {args.index(f) + 1 for f in ("-o", "-g", "-m") if f in args}
        for i, path in enumerate(args):
            if i not in skip and not path.startswith("-"):
                stage.owners[_absolute(stage, path)] = owner
    elif program == "chown":
        rest = [a for a in args if not a.startswith("-")]
        owner = rest[0].split(":")[0]
        for path in rest[1:]:
            stage.owners[_absolute(stage, path)] = owner


def _absolute(stage: Stage, path: str) -> str:
    return posixpath.normpath(posixpath.join(stage.workdir, path))
