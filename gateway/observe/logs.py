"""structlog setup: JSON lines when not on a terminal, one line per request, never a key.

The request line is written at every request's end, so the JSON path is built for speed: one
processor stamps and encodes (`JsonLine`) where structlog's stock chain took four, and the
request line itself skips structlog's per-call work (`RequestLog`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any, BinaryIO

import msgspec
import structlog

from gateway.core.record import Outcome
from providers.contract.log import get_logger
from providers.contract.redact import Redactor

_LEVEL_NAMES = {"warn": "warning", "exception": "error"}  # as structlog's add_log_level


def configure(level: str | None = None, json: bool | None = None) -> RequestLog:
    """Configure structlog once per process, JSON unless stderr is a terminal; return the
    writer of the per-request line for that configuration."""
    level = level or os.environ.get("LLMS_LOG_LEVEL", "info")
    as_json = not sys.stderr.isatty() if json is None else json
    pid = os.getpid()  # with --workers N, says which worker wrote the line
    logger_factory: Any
    threshold = logging.getLevelName(level.upper())
    redaction = LogRedaction()
    line = JsonLine(pid, redaction) if as_json else None
    request_log = RequestLog(line, sys.stderr.buffer, redaction, enabled=threshold <= logging.INFO)
    if line is not None:
        processors: list[structlog.typing.Processor] = [
            structlog.processors.format_exc_info, line]
        logger_factory = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        def add_pid(_: Any, __: str, event: structlog.typing.EventDict
                    ) -> structlog.typing.EventDict:
            event["pid"] = pid
            return event

        processors = [structlog.processors.add_log_level, add_pid,
                      structlog.processors.TimeStamper(fmt="iso", utc=True),
                      structlog.processors.format_exc_info,
                      structlog.dev.ConsoleRenderer(colors=False), redaction]
        logger_factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=logger_factory,
        cache_logger_on_first_use=True,
    )
    return request_log



class LogRedaction:
    """The redactor every log line passes, swapped with the config (`Runtime.apply`): log
    lines carry upstream messages, which may echo a configured secret. On a terminal, the last
    processor."""

    __slots__ = ("redactor",)

    def __init__(self) -> None:
        self.redactor = Redactor()

    def __call__(self, _: Any, __: str, line: Any) -> Any:
        # `Any`: structlog's processor signature, though the renderer before it hands a str.
        return self.redactor.text(line)


class JsonLine:
    """The last processor: adds level, pid and an ISO UTC timestamp, returns the JSON line with
    every configured secret removed."""

    __slots__ = ("_pid", "_redaction", "_request_head", "_second")

    def __init__(self, pid: int, redaction: LogRedaction) -> None:
        self._pid = pid
        self._redaction = redaction
        self._second: tuple[int, str] = (-1, "")  # one attribute: threads may log too
        # The `request` line's fields after its own, up to its timestamp's second: made once a
        # second, kept as `_second` is.
        self._request_head: tuple[int, bytes] = (-1, b"")

    def __call__(self, _: Any, method: str, event: structlog.typing.EventDict) -> bytes:
        event["level"] = _LEVEL_NAMES.get(method, method)
        event["pid"] = self._pid
        event["timestamp"] = self.timestamp(time.time())
        return self._redaction.redactor.encoded(msgspec.json.encode(event, enc_hook=str))

    def request(self, line: RequestLine, extra: dict[str, Any] | None) -> bytes:
        """The `request` line as the processor would make it of the same fields, newline
        ended: the Struct's JSON, `extra`'s fields, then event, level, pid and timestamp,
        spliced as bytes."""
        now = time.time()
        second = int(now)
        cached, head = self._request_head
        if second != cached:
            head = b',"event":"request","level":"info","pid":%d,"timestamp":"%s' % (
                self._pid, self._up_to(second).encode())
            self._request_head = (second, head)
        body = msgspec.json.encode(line)[:-1]
        if extra:
            body += b"," + msgspec.json.encode(extra, enc_hook=str)[1:-1]
        return self._redaction.redactor.encoded(
            b'%s%s.%06dZ"}\n' % (body, head, int((now - second) * 1_000_000)))

    def timestamp(self, now: float) -> str:
        """`2026-11-23T16:53:22.123456Z`; the part up to the second is formatted once a second."""
        second = int(now)
        return f"{self._up_to(second)}.{int((now - second) * 1_000_000):06d}Z"

    def _up_to(self, second: int) -> str:
        cached, text = self._second
        if second != cached:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return text


class RequestLine(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The `request` line's own fields, in the order it shows them: a Struct, encoded with its
    names known in advance, where a dict built per request cost more than the rest of the log.
    Fields with a default appear only when set."""

    request_id: str
    endpoint: str
    model: str | None
    alias: str | None = None  # when not the name sent
    provider: str | None
    status: int
    outcome: Outcome | None  # encoded as its value
    attempts: int
    failed: list[str] | None
    stream: bool
    key_id: str | None
    tokens: int | None
    cost: float | None
    ttft_ms: float | None
    latency_ms: float
    overhead_ms: float | None
    error: str | None = None
    cache: str | None = None
    idempotent: str | None = None
    resumed: int | None = None
    resumes_failed: int | None = None
    resumed_by: str | None = None


class RequestLog:
    """Writes the one `request` line per request. In JSON mode it goes straight to the stream,
    in the shape every other line has: structlog's per-call work (the fields copied three times,
    the processor chain) was 3-5% of the gateway's req/s at 50 clients. The lines written in one
    turn of the event loop are flushed together in the next: one write to the stream for many
    requests under load, none held longer than that. On a terminal it goes through structlog
    like everything else."""

    __slots__ = ("_enabled", "_flushing", "_line", "_stream", "redaction")

    def __init__(self, line: JsonLine | None, stream: BinaryIO,
                 redaction: LogRedaction | None = None, enabled: bool = True) -> None:
        self._line = line
        self._stream = stream
        self._enabled = enabled
        self._flushing = False  # a flush is due at the end of this turn of the loop
        self.redaction = redaction or LogRedaction()  # shared with the structlog chain

    def write(self, line: RequestLine, extra: dict[str, Any] | None = None) -> None:
        """Log `line` (and `extra` fields after it) as the `request` event at info level."""
        if not self._enabled:
            return
        if self._line is None:
            get_logger().info("request", **msgspec.json.decode(msgspec.json.encode(line)),
                              **(extra or {}))
            return
        self._stream.write(self._line.request(line, extra))
        if self._flushing:
            return
        try:
            asyncio.get_running_loop().call_soon(self._flush)
        except RuntimeError:  # no loop (a thread, a script): now
            self._stream.flush()
        else:
            self._flushing = True

    def _flush(self) -> None:
        self._flushing = False
        self._stream.flush()
