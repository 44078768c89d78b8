"""The request's record: what one relayed request did, and its one ending.

The pipeline fills the record as the request goes (model, key, who served it, usage, cost);
the request ends once, with an `Outcome`, and every listener registered at startup hears the
finished record: metrics, recent traffic, the request log, the key's token spend (next: traces,
spend per key). A listener observes; it never changes the answer.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.core import endpoints
from gateway.core.errors import Attempt
from providers.contract.errors import Dialect
from providers.contract.provider import Resumes
from providers.contract.usage import Price, Usage
from providers.contract.usage import cost as cost_of

MAX_REQUEST_ID = 128
# The headers `Record.headers` may give an answer (the edge encodes their names once).
HEADERS = ("x-request-id", "x-llms-overhead-ms", "x-llms-attempts", "x-llms-provider",
           "x-llms-model", "x-llms-cost", "x-llms-hedged", "x-llms-resumed")


class Outcome(enum.Enum):
    """How a request ended."""

    COMPLETED = "completed"  # the whole answer, or the whole stream, was sent
    ERROR = "error"  # an error answer, or a stream that ended with an in-band error
    CLIENT_LEFT = "client_disconnected"  # the client went away before its answer was sent


def request_id(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` if it sent a sane one, else a new one."""
    sent = headers.get("x-request-id")
    if sent and len(sent) <= MAX_REQUEST_ID and sent.isprintable():
        return sent
    # Time first (milliseconds, 12 hex digits), then 48 random bits: the request log's index
    # on ids is written at its end, not at a random page of it per row.
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(6).hex()}"


@dataclass(slots=True)
class Record:
    """One relayed request, from admission to its end."""

    request_id: str
    endpoint: str
    listeners: Sequence[Listener] = field(repr=False)
    started: float = field(default_factory=time.perf_counter)
    model: str | None = None  # the name the client sent
    known_model: bool = False  # `model` resolved to an alias of the config
    alias: str | None = None  # the alias it resolved to; once served, the one that served it
    stream: bool = False
    key_id: str | None = None
    team: str | None = None  # the virtual key's team (`gateway.accounts`)
    # What accounts hold for it, its parallel slot and its budget hold
    # (`gateway.accounts.service.Charge`).
    charge: object | None = None
    # Headers the stages that own them give the answer (`mark`).
    marks: dict[str, str] | None = None
    provider: str | None = None
    cache_hit: bool = False  # answered from the response cache (`provider` said who first did)
    # Answered by the request its `Idempotency-Key` repeats (`gateway.idempotency.flight`):
    # no usage nor cost of its own, that request counted them.
    replayed: bool = False
    failed: tuple[Attempt, ...] = ()
    hedged: bool = False
    hedge_won: bool = False
    lost: tuple[str, ...] = ()  # the providers of tries that lost a hedge race
    # The actions guardrails took on it, as `x-llms-guardrails` lists them ("pseudonymize:pii=2",
    # "block:no-secrets"), for the request log.
    guardrails: list[str] | None = None
    # What the request log keeps of its bodies (`gateway.requestlog.capture`); None: nothing.
    bodies: object | None = None
    resumes: Resumes | None = None  # its broken streams resumed (`gateway.adapters.resume`)
    status: int = 200
    error_code: str | None = None
    usage: Usage | None = None
    cost: float | None = None
    # Dollars of tries its providers bill beside the answer's usage: hedges that lost (`beside`)
    # and, through `resumes`, resumed streams' continuations; in `cost` once that is known.
    aside: float = 0.0
    ttft: float | None = None
    events: int = 0  # data events a stream relayed (a stream cut before its usage is charged by)
    upstream_time: float | None = None
    # Seconds spent waiting on upstreams (every try, its backoff and hedge): what is not the
    # gateway's own time (`overhead`).
    upstream_wait: float = 0.0
    # The gateway's own seconds until the answer's head was ready, upstream waits excluded:
    # `x-llms-overhead-ms`, set when the head is made.
    overhead: float | None = None
    outcome: Outcome | None = None  # set once, by `end`
    # How it ends, whatever its answer's own end says: set by a stage that threw the answer
    # away for an error of its own (`overruled`).
    verdict: Outcome | None = None
    duration: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)  # extra fields for the log line

    @property
    def dialect(self) -> Dialect:
        """The error shape this endpoint's clients read."""
        return Dialect.ANTHROPIC if self.endpoint in endpoints.ANTHROPIC else Dialect.OPENAI

    @property
    def attempts(self) -> int:
        """Tries made: every failed one, and the one that answered."""
        # `from_store` spelled out: read three times a request, a call each time.
        served = self.provider is not None and not (self.cache_hit or self.replayed)
        return len(self.failed) + served

    @property
    def from_store(self) -> bool:
        """Answered with what an earlier request got, without a try of its own."""
        return self.cache_hit or self.replayed

    def headers(self) -> dict[str, str]:
        """What the answer tells of the request: its id, the gateway's own time so far, tries,
        provider and the alias that served, cost."""
        self.overhead = overhead = time.perf_counter() - self.started - self.upstream_wait
        headers = {"x-request-id": self.request_id,
                   "x-llms-overhead-ms": "%.2f" % (overhead * 1000)}  # f"{:.2f}" parses more
        if attempts := self.attempts:
            headers["x-llms-attempts"] = str(attempts)
        if self.provider:
            headers["x-llms-provider"] = self.provider
            if self.alias:
                headers["x-llms-model"] = self.alias
        if self.cost is not None:
            headers["x-llms-cost"] = f"{self.cost:.6f}"
        if self.hedged:
            headers["x-llms-hedged"] = "1"
        if self.marks is not None:
            headers.update(self.marks)
        if self.resumes is not None and self.resumes.ok:  # a whole answer's (a stream's
            headers["x-llms-resumed"] = str(self.resumes.ok)  # headers left before)
        return headers

    def mark(self, header: str, value: str) -> None:
        """A header the answer carries for a stage that owns it (a cache hit, a replay, a
        budget's remainder)."""
        if self.marks is None:
            self.marks = {header: value}
        else:
            self.marks[header] = value

    def used(self, usage: Usage | None, price: Price | None) -> None:
        """What the answer used, priced, with what the tries beside it cost."""
        self.usage = usage
        if usage is not None and price is not None:
            self.cost = cost_of(usage, price) + self.billed_aside()
        elif self.billed_aside():
            self.cost = self.billed_aside()

    def beside(self, usage: Usage, price: Price | None) -> None:
        """A try that did not answer but that its provider bills (a hedge that lost): its
        cost is the request's too."""
        if price is not None:
            self.aside += cost_of(usage, price)

    def billed_aside(self) -> float:
        """Dollars of the tries beside the answer: hedges that lost, continuations of resumed
        streams beyond the usage the client sees."""
        return self.aside + (self.resumes.billed if self.resumes is not None else 0.0)

    def overruled(self, status: int, code: str) -> None:
        """A stage threw the answer away for an error of its own (a guardrail's block): the
        request ends as that error, however the answer it threw away ends (closed: as if its
        client had left)."""
        self.status, self.error_code, self.verdict = status, code, Outcome.ERROR

    def first_token(self) -> None:
        """The answer's first byte is ready to go."""
        self.ttft = time.perf_counter() - self.started

    def end(self, outcome: Outcome, usage: Usage | None = None,
            price: Price | None = None, **detail: Any) -> None:
        """The request is over: every listener hears it, once (a later call is ignored)."""
        if self.outcome is not None:
            return
        if usage is not None:
            self.used(usage, price)
        self.outcome = self.verdict or outcome
        self.duration = time.perf_counter() - self.started
        self.detail.update(detail)
        for listener in self.listeners:
            listener(self)


Listener = Callable[[Record], None]
