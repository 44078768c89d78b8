"""Which tools a key may use: its allow-list, bounded by its team's (pure).

A list holds namespaced tool names or shell-style patterns (`"docs_*"`); absent means every tool,
`[]` none. A tool is allowed when every list that applies (the key's, its team's) matches it.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from gateway.accounts.account import Account
from gateway.core.call import Identity

Lists = tuple[tuple[str, ...], ...]


def lists_of(identity: Identity | None) -> Lists:
    """The allow-lists that apply to `identity` (a virtual key's and its team's); none for a
    configured key, or an open gateway's anonymous caller."""
    # Looked for by type: `getattr` with a default raises and drops an AttributeError per call
    # on a configured key, which has no such field.
    return identity.mcp_tools if isinstance(identity, Account) else ()


def allows(lists: Lists, name: str) -> bool:
    """Whether `name` passes every list."""
    return all(any(fnmatchcase(name, pattern) for pattern in patterns) for patterns in lists)


def key_of(identity: Identity | None) -> str:
    """Who a call runs as, in limits, audit and spend: the key's id, or `anonymous`."""
    return identity.limits.key_id if identity is not None else "anonymous"
