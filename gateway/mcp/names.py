"""Namespaced names: a server's tool, prompt or resource as clients of `/mcp` see it (pure).

`{server}{separator}{tool}`, within `^[a-zA-Z0-9_-]{1,64}$` with room left for a client's own
prefix of up to `CLIENT_PREFIX` characters. A name with other characters, or too long, is
shortened deterministically: what fits of it, then a hash of the server and the upstream name,
so the same config gives the same names across restarts and upgrades.

A resource's URI (and a template's) is `{server}+{uri}`: a URI still (a server's name is of
letters, digits and `-`, as a scheme is), read back without a table.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64
CLIENT_PREFIX = 16  # e.g. Claude Code's `mcp__gateway__`
LONGEST = MAX_NAME - CLIENT_PREFIX
HASHED = 8  # hex digits of the hash suffix
_UNFIT = re.compile(r"[^A-Za-z0-9_-]")


def namespaced(server: str, name: str, separator: str = "_") -> str:
    """`name` of `server` as the gateway serves it."""
    plain = f"{server}{separator}{name}"
    cleaned = _UNFIT.sub("_", plain)
    if cleaned == plain and len(plain) <= LONGEST:
        return plain
    digest = hashlib.sha256(f"{server}\0{name}".encode()).hexdigest()[:HASHED]
    return f"{cleaned[:LONGEST - HASHED - 1]}-{digest}"


def valid(name: str) -> bool:
    """Whether `name` is a tool name every client accepts."""
    return 0 < len(name) <= MAX_NAME and _UNFIT.search(name) is None


def namespaced_uri(server: str, uri: str) -> str:
    """A resource's URI (or URI template) `uri` of `server` as the gateway serves it."""
    return f"{server}+{uri}"


def server_of_uri(uri: str) -> tuple[str, str]:
    """The server and its own URI behind a namespaced resource URI (no server: `""`)."""
    server, mark, own = uri.partition("+")
    return (server, own) if mark else ("", uri)
