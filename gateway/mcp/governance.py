"""What every tool call through the gateway pays: its key's per-minute limit, its price held
against the key's budgets and charged through the accounts' ledger and spend, an audit row
(arguments redacted as logs are), a metric, and an `execute_tool` span under the request's."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.accounts.account import Account, nano
from gateway.core.call import Identity
from gateway.core.errors import KeyRateLimited
from gateway.core.limits import KeyLimits
from gateway.core.record import Outcome, Record
from gateway.mcp.allowed import key_of
from gateway.mcp.audit import AuditRows

if TYPE_CHECKING:
    from gateway.accounts.service import Charge
    from gateway.state.runtime import Runtime

AUDIT_ACTION = "mcp_tool_call"


class Governed:
    """One tool call's passage: admitted (limit, budget), then ended once (charge, audit,
    metric); `span()` is where the call runs."""

    def __init__(self, runtime: Runtime, audited: AuditRows, identity: Identity | None,
                 server: str, tool: str, name: str, arguments: Any, price: float | None
                 ) -> None:
        self.runtime = runtime
        self.audited = audited
        self.identity = identity
        self.server, self.tool, self.name = server, tool, name
        self.arguments = arguments
        self.price = price
        self.started = time.perf_counter()
        self.charge: Charge | None = None
        self.record: Record | None = None

    async def admit(self) -> None:
        """The key's tool calls per minute (429 with Retry-After), then the call's price held
        against its budgets (429 `budget_exceeded`)."""
        most = self.runtime.live.snapshot.mcp.tool_calls_per_minute
        if most is not None:
            left = self.runtime.limiter.admit(KeyLimits(f"mcp:{key_of(self.identity)}", most))
            if left is not None and left.refused is not None:
                raise KeyRateLimited(f"This key made its {most} MCP tool calls for the minute",
                                     retry_after=max(left.reset, 1.0))
        accounts = self.runtime.accounts
        if accounts is None:
            return
        record = self.record = Record(f"mcp-{time.time_ns():x}", "mcp", (accounts.ended,))
        record.key_id = key_of(self.identity)
        record.provider = self.server
        if isinstance(self.identity, Account):
            record.team = self.identity.team
            if self.price:
                self.charge = await accounts.hold(self.identity, nano(self.price))
                record.charge = self.charge

    def span(self) -> contextlib.AbstractContextManager[None]:
        """The call's `execute_tool` span, a child of the request's (when traced)."""
        if self.runtime.tracing is None:
            return contextlib.nullcontext()
        return self._spanned()

    @contextlib.contextmanager
    def _spanned(self) -> Iterator[None]:
        tracing = self.runtime.tracing
        assert tracing is not None
        from opentelemetry.trace import SpanKind, Status, StatusCode

        with tracing.tracer.start_as_current_span(
                f"execute_tool {self.name}", kind=SpanKind.INTERNAL,
                attributes={"gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": self.name, "mcp.server": self.server,
                            "mcp.tool": self.tool}) as span:
            try:
                yield
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise

    def guarded(self, header: str) -> None:
        """The guardrails' actions on the call (`x-llms-guardrails`), kept on its spend row."""
        if header and self.record is not None:
            self.record.detail["guardrails"] = header

    def end(self, outcome: str, status: int = 200) -> None:
        """The call is over (`status`: as a spend row tells it): its price charged when the
        upstream answered (given back otherwise), its audit row written off the request's
        path, its metrics counted."""
        seconds = time.perf_counter() - self.started
        self.runtime.metrics.tool_call(self.server, self.tool, outcome, seconds)
        accounts = self.runtime.accounts
        if accounts is None:
            return
        if self.record is not None:
            answered = outcome in ("completed", "tool_error")
            self.record.status = status
            self.record.cost = self.price if answered and self.price else None
            self.record.end(Outcome.COMPLETED if answered else Outcome.ERROR)
        change = {"server": self.server, "tool": self.tool, "name": self.name,
                  "arguments": self.arguments, "latency_ms": round(seconds * 1000, 2),
                  "outcome": outcome}  # its arguments redacted when written (`AuditRows`)
        self.audited.add(key_of(self.identity), AUDIT_ACTION, f"{self.server}/{self.tool}",
                         change)
