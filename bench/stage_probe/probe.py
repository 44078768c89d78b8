"""Stamps each stage of a relayed whole answer inside the gateway, through public hooks only.

The gateway calls `Runtime.trace` with each name of `gateway.state.runtime.STAGES` as a whole
answer passes it (`request` when the ASGI call reaches the relay route, `admitted`, `provider`,
`reply`, `answered` once the answer is handed to the server, `logged` after the log line).
aiohttp's client tracing (`aiohttp.TraceConfig`, when the transport takes one) can add two stamps
on the upstream side: `upstream_sent` (the request's last byte handed to the socket) and
`upstream_head` (the answer's head read). Each answered request becomes one line of
`time.perf_counter_ns()` stamps in DIR/<pid>.log, after a header line naming the stages.

`trace` hears a stage's name, not which request passed it: the request is told by its context (a
`ContextVar` set at `request`), since an ASGI server runs each request in a task, and so a context,
of its own (granian and uvicorn both do: checked with concurrent requests). Requests that overlap
keep their own stamps. A stamp costs ~1 µs.
"""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from gateway.state.runtime import STAGES as APP_STAGES

UPSTREAM_STAGES = ("upstream_sent", "upstream_head")
# Every stage in the order a whole answer passes them, the upstream's two among the app's.
STAGES = (*APP_STAGES[:3], *UPSTREAM_STAGES, *APP_STAGES[3:])
FLUSH_EVERY = 200  # lines: a file write per 200 requests keeps the probe off the request path


class StageRecorder:
    """`trace` for `Runtime.trace`, `trace_config()` for the upstream client; lines to `folder`."""

    def __init__(self, folder: Path, upstream: bool) -> None:
        self.stages = STAGES if upstream else APP_STAGES
        self._path = folder / f"{os.getpid()}.log"
        self._now = time.perf_counter_ns
        self._row: ContextVar[dict[str, int] | None] = ContextVar("stage_row", default=None)
        self._lines: list[str] = ["# " + " ".join(self.stages) + "\n"]
        self.incomplete = 0

    def trace(self, stage: str) -> None:
        now = self._now()
        if stage == "request":
            self._row.set({"request": now})
            return
        row = self._row.get()
        if row is None:
            return
        row[stage] = now
        if stage == "logged":
            self._row.set(None)
            self._line(row)

    def _line(self, row: dict[str, int]) -> None:
        if len(row) != len(self.stages):  # an error answer, or a stream: not a whole answer
            self.incomplete += 1
            return
        self._lines.append(" ".join(str(row[stage]) for stage in self.stages) + "\n")
        if len(self._lines) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        with self._path.open("a") as out:
            out.write("".join(self._lines))
        self._lines.clear()

    def close(self) -> None:
        self._lines.append(f"# incomplete {self.incomplete}\n")
        self.flush()

    def trace_config(self) -> aiohttp.TraceConfig:
        """aiohttp's client tracing, stamping the upstream side into the same rows."""
        config = aiohttp.TraceConfig()

        async def sent(session: aiohttp.ClientSession, context: SimpleNamespace,
                       params: Any) -> None:
            self.trace("upstream_sent")  # headers, then each body chunk: the last one stays

        async def head(session: aiohttp.ClientSession, context: SimpleNamespace,
                       params: Any) -> None:
            self.trace("upstream_head")

        config.on_request_headers_sent.append(sent)
        config.on_request_chunk_sent.append(sent)
        config.on_request_end.append(head)
        return config


def read(folder: Path) -> tuple[tuple[str, ...], list[dict[str, int]], int]:
    """The stages every log in `folder` names, each answered request's stamps, and how many
    requests were dropped (not a whole answer, or stamps out of order)."""
    stages: tuple[str, ...] = ()
    rows: list[dict[str, int]] = []
    dropped = 0
    for log in sorted(folder.glob("*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("# incomplete "):
                dropped += int(line.split()[-1])
            elif line.startswith("# "):
                stages = tuple(line[2:].split())
            elif line:
                stamps = [int(field) for field in line.split()]
                if stamps != sorted(stamps):
                    dropped += 1
                    continue
                rows.append(dict(zip(stages, stamps, strict=True)))
    return stages, rows, dropped
