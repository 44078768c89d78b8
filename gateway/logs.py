"""structlog setup: JSON lines when not on a terminal, one line per request, never a key."""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

import msgspec
import structlog


def configure(level: str | None = None, json: bool | None = None) -> None:
    """Configure structlog once per process; JSON unless stderr is a terminal."""
    level = level or os.environ.get("LLMS_LOG_LEVEL", "info")
    as_json = not sys.stderr.isatty() if json is None else json
    pid = os.getpid()  # with --workers N, says which worker wrote the line

    def add_pid(_: Any, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        event["pid"] = pid
        return event

    processors: list[structlog.typing.Processor] = [
        structlog.processors.add_log_level,
        add_pid,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    if as_json:
        processors.append(structlog.processors.JSONRenderer(serializer=_encode))
        logger_factory: Any = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
        logger_factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=logger_factory,
        cache_logger_on_first_use=True,
    )


def _encode(event: Any, **_: Any) -> bytes:
    return msgspec.json.encode(event, enc_hook=str)


@functools.cache
def get_logger(name: str = "llms-gateway") -> structlog.typing.FilteringBoundLogger:
    """The gateway's logger, one per name: structlog caches its bound form on first use only
    when the same proxy is reused, and a fresh one per request cost a logger per log line."""
    return structlog.get_logger(name)
