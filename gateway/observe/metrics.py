"""Prometheus metrics, recorded once per request when it ends (`record`).

Labels are bounded: model aliases from the config (an unknown model is `_unknown`), provider
names, endpoints, statuses and failure reasons. Never a user string, never a key.

In one process the numbers are plain Python (`LocalValues`), turned into Prometheus' text when
`/metrics` is scraped: prometheus_client's metric objects take a lock per increment, nine per
request, against threads the event loop does not have. With `--workers N` the CLI points
`PROMETHEUS_MULTIPROC_DIR` at a fresh directory; then each worker records through
prometheus_client (`SharedValues`), whose files `/metrics` on any worker sums.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gateway.core.errors import Attempt
from gateway.routing.health import ProviderHealth
from gateway.routing.hedging import Hedging
from providers.contract.usage import Usage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
CIRCUIT_VALUES = {"closed": 0, "half_open": 1, "open": 2, "cooling_down": 3}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
ATTEMPTS = Family("llms_attempts_per_request", "Tries per answered request", (),
                  (1, 2, 3, 4, 6, 10))
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


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


class Values(Protocol):
    """Where `Metrics.record` puts its numbers."""

    def inc(self, family: Family, labels: Labels, amount: float = 1.0) -> None: ...

    def observe(self, family: Family, labels: Labels, value: float) -> None: ...


class LocalValues:
    """This process's numbers, in plain dicts: the event loop is their only writer."""

    def __init__(self) -> None:
        self._rows: dict[Family, dict[Labels, Any]] = {family: {} for family in FAMILIES}

    def inc(self, family: Family, labels: Labels, amount: float = 1.0) -> None:
        rows = self._rows[family]
        rows[labels] = rows.get(labels, 0.0) + amount

    def observe(self, family: Family, labels: Labels, value: float) -> None:
        assert family.buckets is not None
        rows = self._rows[family]
        if (row := rows.get(labels)) is None:  # a count per bucket, +Inf's, then the sum
            row = rows[labels] = [0] * (len(family.buckets) + 1) + [0.0]
        row[bisect_left(family.buckets, value)] += 1  # a bucket counts values <= its bound
        row[-1] += value

    def collect(self) -> Iterator[Metric]:
        """Every family in Prometheus' terms, as it stands now."""
        for family, rows in self._rows.items():
            names = list(family.labels)
            if family.buckets is None:
                counter = CounterMetricFamily(family.name, family.help, labels=names)
                for labels, total in rows.items():
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

    def _child(self, family: Family, labels: Labels) -> Any:
        if (child := self._children.get((family, labels))) is None:
            metric = self._metrics[family]
            child = metric.labels(*(str(v) for v in labels)) if labels else metric
            self._children[(family, labels)] = child
        return child


class Metrics:
    """Every metric the gateway exports."""

    def __init__(self, health: ProviderHealth, inflight: Callable[[], int] = lambda: 0,
                 queued: Callable[[], int] = lambda: 0, hedging: Hedging | None = None
                 ) -> None:
        """`inflight` reads the requests in the gateway, `queued` those of them waiting for a slot:
        in one process the gauges call them when scraped; with several workers each moves its
        share (`add_inflight`, `add_queued`). `hedging`'s delays and budgets are read when
        scraped."""
        self._health = health
        self._hedging = hedging
        self._registry = CollectorRegistry()
        self._shared = SharedValues(self._registry) if multiprocess_dir() else None
        self.values: Values = self._shared or LocalValues()
        if isinstance(self.values, LocalValues):
            self._registry.register(_LocalCollector(self.values, inflight, queued))
            self._registry.register(_CircuitCollector(health))
            if hedging is not None:
                self._registry.register(_HedgingCollector(hedging))

    def add_inflight(self, delta: int) -> None:
        """This worker's in-flight count moved by `delta`; only several workers need telling."""
        if self._shared is not None:
            self._shared.inflight.inc(delta)

    def add_queued(self, delta: int) -> None:
        """This worker's queue depth moved by `delta`; only several workers need telling."""
        if self._shared is not None:
            self._shared.queued.inc(delta)

    def queue_wait(self, key: str, seconds: float) -> None:
        """A request got its slot after waiting `seconds` (0: one was free)."""
        self.values.observe(QUEUE_WAIT, (key,), seconds)

    def queue_dropped(self, key: str, reason: str) -> None:
        """A request left the queue without a slot, for `reason`."""
        self.values.inc(QUEUE_DROPPED, (key, reason))

    def record(self, *, endpoint: str, model: str, provider: str | None, status: int,
               duration: float, ttft: float | None, upstream: float | None,
               failed: Iterable[Attempt], attempts: int, usage: Usage | None,
               cost: float | None) -> None:
        """Count one finished request."""
        values = self.values
        values.inc(REQUESTS, (endpoint, model, provider or "none", status))
        for attempt in failed:
            values.inc(FAILOVERS, (model, attempt.provider, attempt.reason))
        if provider is None:
            return
        served = (model, provider)
        values.observe(LATENCY, served, duration)
        values.observe(ATTEMPTS, (), attempts)
        if ttft is not None:
            values.observe(TTFT, served, ttft)
        if upstream is not None:
            values.observe(OVERHEAD, (), max(0.0, duration - upstream))
        if usage is not None:
            values.inc(TOKENS, (model, provider, "prompt"), usage.prompt_tokens)
            values.inc(TOKENS, (model, provider, "completion"), usage.completion_tokens)
            if usage.reasoning_tokens:
                values.inc(TOKENS, (model, provider, "reasoning"), usage.reasoning_tokens)
        if cost:
            values.inc(COST, served, cost)

    def tool_call(self, server: str, tool: str, outcome: str, seconds: float) -> None:
        """An MCP tool call ended (`gateway.mcp.governance`)."""
        self.values.inc(MCP_CALLS, (server, tool, outcome))
        self.values.observe(MCP_LATENCY, (server,), seconds)

    def cache_lookup(self, model: str, result: str) -> None:
        """A response cache lookup: hit, miss or bypass."""
        self.values.inc(CACHE_LOOKUPS, (model, result))

    def cache_stored(self, model: str, size: int) -> None:
        self.values.inc(CACHE_STORED, (model,), size)

    def hedge(self, model: str, result: str) -> None:
        """A hedge started, or won."""
        self.values.inc(HEDGES, (model, result))

    def resumed(self, model: str, result: str, count: int) -> None:
        """Resumes of a request's broken streams, by result: ok or failed."""
        self.values.inc(RESUMES, (model, result), count)

    def guardrail(self, guardrail: str, category: str, action: str, count: int) -> None:
        """`count` values a guardrail met, and what it did (`gateway.guardrails`)."""
        self.values.inc(GUARDRAIL_ACTIONS, (guardrail, category, action), count)

    def exposition(self, keys: bool = True) -> bytes:
        """The text `/metrics` serves: this process, or every worker's when there are several;
        without the series labelled by key unless `keys` (a reader who is not an admin)."""
        if self._shared is None:
            registry = self._registry
        else:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            registry.register(_CircuitCollector(self._health))
            if self._hedging is not None:  # the scraped worker's own, as its circuits are
                registry.register(_HedgingCollector(self._hedging))
        if not keys:
            unkeyed = CollectorRegistry()
            unkeyed.register(_WithoutKeys(registry))
            registry = unkeyed
        return generate_latest(registry)


class _WithoutKeys(Collector):
    """Another registry's metrics but the families labelled by key."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        return (metric for metric in self._source.collect() if metric.name not in KEYED)


class _LocalCollector(Collector):
    """One process's recorded numbers, its in-flight count and queue depth, at scrape time."""

    def __init__(self, values: LocalValues, inflight: Callable[[], int],
                 queued: Callable[[], int]) -> None:
        self._values = values
        self._inflight = inflight
        self._queued = queued

    def collect(self) -> Iterable[Metric]:
        yield from self._values.collect()
        yield GaugeMetricFamily(*INFLIGHT, value=self._inflight())
        yield GaugeMetricFamily(*QUEUE_DEPTH, value=self._queued())


class _CircuitCollector(Collector):
    """Circuit state per (provider, model), read from the live health state at scrape time."""

    def __init__(self, health: ProviderHealth) -> None:
        self._health = health

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "llms_circuit_state",
            "0 closed, 1 half-open, 2 open, 3 cooling down after a 429 (model empty)",
            labels=["provider", "model"])
        for row in self._health.snapshot():
            family.add_metric([str(row["provider"]), str(row["model"] or "")],
                              CIRCUIT_VALUES.get(str(row["state"]), 0))
        yield family


class _HedgingCollector(Collector):
    """Per alias that hedges: the delay each leading provider gets, the budget's use."""

    def __init__(self, hedging: Hedging) -> None:
        self._hedging = hedging

    def collect(self) -> Iterable[Metric]:
        delay = GaugeMetricFamily(
            "llms_hedge_delay_seconds", "Seconds a request waits on its leading candidate "
            "before a hedge may start (learned for a quantile hedge_after)",
            labels=["model", "provider"])
        used = GaugeMetricFamily(
            "llms_hedge_budget_used_ratio", "Share of the alias's recent requests hedged "
            "(hedge_budget is its most)", labels=["model"])
        refused = CounterMetricFamily(
            "llms_hedges_over_budget", "Hedges not started: the alias's budget was spent",
            labels=["model"])
        for alias, view in self._hedging.view().items():
            used.add_metric([alias], view["budget_used"])
            refused.add_metric([alias], view["over_budget"])
            for row in view["delays"]:
                delay.add_metric([alias, row["provider"]], row["delay_s"])
        yield from (delay, used, refused)


def _go_float(value: float) -> str:
    """A bucket bound as Prometheus writes it (`le="0.5"`, `le="+Inf"`)."""
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text
