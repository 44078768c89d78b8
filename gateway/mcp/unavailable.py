"""The one error of an upstream MCP server's link, apart so that what raises and catches it
imports no SDK."""

from __future__ import annotations


class Unavailable(Exception):
    """The server is not connected, its connection failed during the call, or it did not
    answer within its timeout."""
