"""Where the metrics' numbers are kept: the families `gateway.observe.metrics` exports, and
their values, in plain Python in one process (`LocalValues`), through prometheus_client's metric
objects with several workers (`SharedValues`).

Labels are bounded: model aliases from the config (an unknown model is `_unknown`), provider
names, endpoints, statuses and failure reasons. Never a user string, never a key.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from providers.contract.usage import Usage

# Floats all: a bucket is found by comparing a float with each bound, and a float compares
# with an int the long way.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a dict key per record
class Family:
    """One metric: a counter, or a histogram when it has buckets."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


REQUESTS = Family("llms_requests", "Requests by endpoint, model, provider, status",
                  ("endpoint", "model", "provider", "status"))
LATENCY = Family("llms_request_duration_seconds", "End-to-end time, to the last byte for streams",
                 ("model", "provider"), LATENCY_BUCKETS)
TTFT = Family("llms_time_to_first_token_seconds",
              "Streams: time until the first chunk reached the client", ("model", "provider"),
              LATENCY_BUCKETS)
OVERHEAD = Family("llms_gateway_overhead_seconds",
                  "Non-streamed answers: total time minus upstream time", (), OVERHEAD_BUCKETS)
FAILOVERS = Family("llms_failovers", "Failed tries that moved a request on",
                   ("model", "provider", "reason"))
ATTEMPTS_BUCKETS = (1, 2, 3, 4, 6, 10)
ATTEMPTS = Family("llms_attempts_per_request", "Tries per answered request", (),
                  ATTEMPTS_BUCKETS)
TOKENS = Family("llms_tokens", "Tokens by kind (prompt, completion, reasoning)",
                ("model", "provider", "kind"))
COST = Family("llms_cost_usd", "Cost at the prices in llms.json", ("model", "provider"))
CACHE_LOOKUPS = Family("llms_cache_lookups", "Response cache lookups by result (hit, miss, "
                       "bypass: the client said no-cache)", ("model", "result"))
CACHE_STORED = Family("llms_cache_stored_bytes", "Bytes of answers put in the response cache",
                      ("model",))
HEDGES = Family("llms_hedges", "Hedged requests: started, and won by the hedge",
                ("model", "result"))
RESUMES = Family("llms_resumes", "Broken streams resumed by another try: ok (its continuation "
                 "went on), failed (none could continue)", ("model", "result"))
QUEUE_WAIT = Family("llms_queue_wait_seconds", "Time a request waited for a slot under "
                    "server.max_concurrency (0 when one was free), by key", ("key",),
                    LATENCY_BUCKETS)
QUEUE_DROPPED = Family("llms_queue_dropped", "Requests that left the queue without a slot, by "
                       "key and reason: full, deadline (refused early), timeout, client_left",
                       ("key", "reason"))
GUARDRAIL_ACTIONS = Family("llms_guardrail_actions", "Values guardrails met, by guardrail, "
                           "category (EMAIL, SECRET, ...) and action taken",
                           ("guardrail", "category", "action"))
MCP_CALLS = Family("llms_mcp_tool_calls", "MCP tool calls through the gateway, by server, tool "
                   "(its upstream name) and outcome", ("server", "tool", "outcome"))
MCP_LATENCY = Family("llms_mcp_tool_call_duration_seconds", "MCP tool calls' time, by server",
                     ("server",), LATENCY_BUCKETS)
FAMILIES = (REQUESTS, LATENCY, TTFT, OVERHEAD, FAILOVERS, ATTEMPTS, TOKENS, COST, CACHE_LOOKUPS,
            CACHE_STORED, HEDGES, RESUMES, QUEUE_WAIT, QUEUE_DROPPED, GUARDRAIL_ACTIONS,
            MCP_CALLS, MCP_LATENCY)
# The families labelled by key: a key's id is shown only to who may read every key's.
KEYED = frozenset(family.name for family in FAMILIES if "key" in family.labels)
INFLIGHT = ("llms_inflight_requests", "Requests in the gateway: served, or queued for a slot")
QUEUE_DEPTH = ("llms_queue_depth", "Requests waiting for a slot under server.max_concurrency")

Labels = tuple[Any, ...]  # label values; exported as str()


class Values(Protocol):
    """Where `Metrics.record` puts its numbers."""

    def inc(self, family: Family, labels: Labels, amount: float = 1.0) -> None: ...

    def observe(self, family: Family, labels: Labels, value: float) -> None: ...

    def answered(self, endpoint: str, model: str, provider: str | None, status: int,
                 duration: float, ttft: float | None, upstream: float | None, attempts: int,
                 usage: Usage | None, cost: float | None) -> None:
        """One finished request: its count, and with a provider its times, tries, tokens and
        cost (`Metrics.record`)."""


class LocalValues:
    """This process's numbers, in plain dicts: the event loop is their only writer. A counter's
    row is a one-item list, so that the rows a kind of request adds to are found once
    (`_Served`) and added to in place."""

    def __init__(self) -> None:
        self._rows: dict[Family, dict[Labels, Any]] = {family: {} for family in FAMILIES}
        self._served: dict[Labels, _Served] = {}  # by endpoint, model, provider, status

    def inc(self, family: Family, labels: Labels, amount: float = 1.0) -> None:
        self.counter(family, labels)[0] += amount

    def observe(self, family: Family, labels: Labels, value: float) -> None:
        # `histogram` and `_observe` spelled out for a row that exists: a queue's wait is
        # observed for every request.
        buckets = family.buckets
        assert buckets is not None
        if (row := self._rows[family].get(labels)) is None:
            row = self.histogram(family, labels)
        row[bisect_left(buckets, value)] += 1  # a bucket counts values <= its bound
        row[-1] += value

    def counter(self, family: Family, labels: Labels) -> list[float]:
        """The row of `family` for `labels`: its total."""
        rows = self._rows[family]
        if (row := rows.get(labels)) is None:
            row = rows[labels] = [0.0]
        return row

    def histogram(self, family: Family, labels: Labels) -> list[Any]:
        """The row of `family` for `labels`: a count per bucket, +Inf's, then the sum."""
        assert family.buckets is not None
        rows = self._rows[family]
        if (row := rows.get(labels)) is None:
            row = rows[labels] = [0] * (len(family.buckets) + 1) + [0.0]
        return row

    def answered(self, endpoint: str, model: str, provider: str | None, status: int,
                 duration: float, ttft: float | None, upstream: float | None, attempts: int,
                 usage: Usage | None, cost: float | None) -> None:
        """`Metrics.record`'s numbers, added to the rows its kind of request found once: a
        request adds to up to nine, in one call and one lookup instead of one each. A row is
        made when first added to, as `inc` and `observe` make theirs: a series appears once it
        has a value, in the order the values came."""
        if (served := self._served.get((endpoint, model, provider, status))) is None:
            served = self._served[(endpoint, model, provider, status)] = _Served(
                self, endpoint, model, provider, status)
        served.requests[0] += 1
        if provider is None:
            return
        row = served.latency
        row[bisect_left(LATENCY_BUCKETS, duration)] += 1
        row[-1] += duration
        row = served.attempts
        row[0 if attempts == 1 else bisect_left(ATTEMPTS_BUCKETS, attempts)] += 1  # mostly one
        row[-1] += attempts
        if ttft is not None:
            if (ttfts := served.ttft) is None:
                ttfts = served.ttft = self.histogram(TTFT, served.labels)
            _observe(ttfts, TTFT, ttft)
        if upstream is not None:
            if (overheads := served.overhead) is None:
                overheads = served.overhead = self.histogram(OVERHEAD, ())
            overhead = duration - upstream if duration > upstream else 0.0
            overheads[bisect_left(OVERHEAD_BUCKETS, overhead)] += 1
            overheads[-1] += overhead
        if usage is not None:
            if (tokens := served.tokens) is None:
                tokens = served.tokens = (self.counter(TOKENS, (model, provider, "prompt")),
                                          self.counter(TOKENS, (model, provider, "completion")))
            tokens[0][0] += usage.prompt_tokens
            tokens[1][0] += usage.completion_tokens
            # `usage.reasoning_tokens`, spelled out: a property is a call of its own.
            details = usage.completion_tokens_details
            if details is not None and (reasoning := details.reasoning_tokens):
                self.inc(TOKENS, (model, provider, "reasoning"), reasoning)
        if cost:
            self.inc(COST, served.labels, cost)

    def collect(self) -> Iterator[Metric]:
        """Every family in Prometheus' terms, as it stands now."""
        for family, rows in self._rows.items():
            names = list(family.labels)
            if family.buckets is None:
                counter = CounterMetricFamily(family.name, family.help, labels=names)
                for labels, (total,) in rows.items():
                    counter.add_metric([str(v) for v in labels], total)
                yield counter
                continue
            histogram = HistogramMetricFamily(family.name, family.help, labels=names)
            bounds = [_go_float(b) for b in family.buckets] + ["+Inf"]
            for labels, row in rows.items():
                cumulative, running = [], 0
                for bound, count in zip(bounds, row[:-1], strict=True):
                    running += count
                    cumulative.append((bound, running))
                histogram.add_metric([str(v) for v in labels], cumulative, row[-1])
            yield histogram


class _Served:
    """The rows one kind of finished request adds to (`LocalValues.answered`): its endpoint,
    model, provider and status. Those of what not every request has (a time to first token,
    usage) are found when first added to."""

    __slots__ = ("attempts", "labels", "latency", "overhead", "requests", "tokens", "ttft")

    def __init__(self, values: LocalValues, endpoint: str, model: str, provider: str | None,
                 status: int) -> None:
        self.requests = values.counter(REQUESTS, (endpoint, model, provider or "none", status))
        self.labels = (model, provider)
        # Added to by every request that has a provider, from the first on.
        self.latency = values.histogram(LATENCY, self.labels) if provider is not None else []
        self.attempts = values.histogram(ATTEMPTS, ()) if provider is not None else []
        self.ttft: list[Any] | None = None
        self.overhead: list[Any] | None = None
        self.tokens: tuple[list[float], list[float]] | None = None  # prompt, completion


def _observe(row: list[Any], family: Family, value: float) -> None:
    assert family.buckets is not None
    row[bisect_left(family.buckets, value)] += 1  # a bucket counts values <= its bound
    row[-1] += value


class SharedValues:
    """prometheus_client's metric objects, for several workers: each writes its own files."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._metrics: dict[Family, Counter | Histogram] = {
            family: (Counter(family.name, family.help, family.labels, registry=registry)
                     if family.buckets is None else
                     Histogram(family.name, family.help, family.labels, buckets=family.buckets,
                               registry=registry))
            for family in FAMILIES}
        self._children: dict[tuple[Family, Labels], Any] = {}
        self.inflight = Gauge(*INFLIGHT, registry=registry, multiprocess_mode="livesum")
        self.queued = Gauge(*QUEUE_DEPTH, registry=registry, multiprocess_mode="livesum")

    def inc(self, family: Family, labels: Labels, amount: float = 1.0) -> None:
        self._child(family, labels).inc(amount)

    def observe(self, family: Family, labels: Labels, value: float) -> None:
        self._child(family, labels).observe(value)

    def answered(self, endpoint: str, model: str, provider: str | None, status: int,
                 duration: float, ttft: float | None, upstream: float | None, attempts: int,
                 usage: Usage | None, cost: float | None) -> None:
        """`Metrics.record`'s numbers, one metric at a time."""
        self.inc(REQUESTS, (endpoint, model, provider or "none", status))
        if provider is None:
            return
        served = (model, provider)
        self.observe(LATENCY, served, duration)
        self.observe(ATTEMPTS, (), attempts)
        if ttft is not None:
            self.observe(TTFT, served, ttft)
        if upstream is not None:
            self.observe(OVERHEAD, (), max(0.0, duration - upstream))
        if usage is not None:
            self.inc(TOKENS, (model, provider, "prompt"), usage.prompt_tokens)
            self.inc(TOKENS, (model, provider, "completion"), usage.completion_tokens)
            if usage.reasoning_tokens:
                self.inc(TOKENS, (model, provider, "reasoning"), usage.reasoning_tokens)
        if cost:
            self.inc(COST, served, cost)

    def _child(self, family: Family, labels: Labels) -> Any:
        if (child := self._children.get((family, labels))) is None:
            metric = self._metrics[family]
            child = metric.labels(*(str(v) for v in labels)) if labels else metric
            self._children[(family, labels)] = child
        return child


def _go_float(value: float) -> str:
    """A bucket bound as Prometheus writes it (`le="0.5"`, `le="+Inf"`)."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text
