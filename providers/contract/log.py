"""The one logger name every part of the gateway logs under; `gateway.observe.logs` configures
it."""

from __future__ import annotations

import functools

import structlog

LOGGER_NAME = "llms-gateway"


@functools.cache
def get_logger(name: str = LOGGER_NAME) -> structlog.typing.FilteringBoundLogger:
    """The gateway's logger, one per name: structlog caches its bound form on first use only
    when the same proxy is reused, and a fresh one per request cost a logger per log line."""
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
