"""The official `mcp` SDK's client pointed at a gateway's `/mcp`, as users write it: their
gateway key as a Bearer token, on the revision a test asks for ("legacy": 2025-11-25 with
`initialize` and a session; "auto": `server/discover`, which the gateway answers 2026-07-28)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

REVISIONS = ("legacy", "auto")
EXPECTED = {"legacy": "2025-11-25", "auto": "2026-07-28"}


@contextlib.asynccontextmanager
async def connected(url: str, key: str | None, mode: str = "auto") -> AsyncIterator[Client]:
    """An SDK client connected to the MCP endpoint `url` with `key`."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0))
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode,
                            cache=None) as client:
        yield client
