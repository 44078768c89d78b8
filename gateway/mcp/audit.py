"""The audit rows of tool calls, written in batches beside the requests: a call only appends its
row here; once a second (and at shutdown) the rows go to the accounts database in one
statement, each call's arguments redacted then as logs are (the configured secrets removed,
what looks like a credential masked) and cut to `MAX_ARGUMENTS` characters. While the database
is down they wait, bounded: past `MAX_BUFFERED` the oldest go (counted in `dropped`), as spend
rows do."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.accounts.tables import audit
from providers.contract.log import get_logger
from providers.contract.redact import mask_credentials

MAX_BUFFERED = 100_000
BATCH = 1_000
EVERY = 1.0  # seconds between two writes
MAX_ARGUMENTS = 4096  # characters of a call's arguments a row keeps


class AuditRows:
    """Tool calls' audit rows on their way to the database."""

    def __init__(self, engine: AsyncEngine | None, redact: Callable[[str], str]) -> None:
        self.engine = engine
        self.redact = redact  # the live config's redactor
        self.rows: deque[dict[str, Any]] = deque()
        self.dropped = 0

    def add(self, actor: str, action: str, target: str, change: Mapping[str, Any]) -> None:
        """One row, written with the next batch."""
        if self.engine is None:
            return
        if len(self.rows) >= MAX_BUFFERED:
            self.rows.popleft()
            self.dropped += 1
        self.rows.append({"time": time.time(), "actor": actor, "action": action,
                          "target": target, "change": dict(change)})

    def _redacted(self, row: dict[str, Any]) -> dict[str, Any]:
        change = row["change"]
        if "arguments" not in change or isinstance(change["arguments"], str):
            return row
        # Redacted whole, then cut: a cut first could leave half a secret no pattern matches.
        text = mask_credentials(self.redact(msgspec.json.encode(change["arguments"]).decode()))
        if len(text) > MAX_ARGUMENTS:
            text = text[:MAX_ARGUMENTS] + "…"
        return {**row, "change": {**change, "arguments": text}}

    async def run(self) -> None:
        """Forever: the rows written once a second."""
        while True:
            await asyncio.sleep(EVERY)
            await self.flush()

    async def flush(self) -> None:
        """Write what is buffered; rows the database refuses now stay, in order."""
        while self.rows and self.engine is not None:
            batch = [self.rows.popleft() for _ in range(min(BATCH, len(self.rows)))]
            try:
                async with self.engine.begin() as conn:
                    await conn.execute(audit.insert(), [self._redacted(row) for row in batch])
            except (SQLAlchemyError, OSError) as exc:
                self.rows.extendleft(reversed(batch))
                get_logger().warning("mcp_audit_unwritten", rows=len(self.rows),
                                     error=type(exc).__name__)
                return
