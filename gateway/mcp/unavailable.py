"""The errors of an upstream MCP server's link, apart so that what raises and catches them
imports no SDK."""

from __future__ import annotations


class Unavailable(Exception):
    """The server is not connected, its connection failed during the call, or it did not
    answer within its timeout."""


class TimedOut(Unavailable):
    """The server did not answer within its timeout (a JSON-RPC request timeout to the
    client, `timeout` in the audit row)."""


class UpstreamError(Exception):
    """The upstream answered the call with a JSON-RPC error (`code`, `message`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
