"""Prometheus metrics, recorded once per request when it ends (`record`).

Labels are bounded (`gateway.observe.values`, the families and where their numbers are kept).

In one process the numbers are plain Python (`LocalValues`), turned into Prometheus' text when
`/metrics` is scraped: prometheus_client's metric objects take a lock per increment, nine per
request, against threads the event loop does not have. With `--workers N` the CLI points
`PROMETHEUS_MULTIPROC_DIR` at a fresh directory; then each worker records through
prometheus_client (`SharedValues`), whose files `/metrics` on any worker sums.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.core.errors import Attempt
from gateway.observe.values import (
    CACHE_LOOKUPS,
    CACHE_STORED,
    FAILOVERS,
    GUARDRAIL_ACTIONS,
    HEDGES,
    INFLIGHT,
    KEYED,
    MCP_CALLS,
    MCP_LATENCY,
    QUEUE_DEPTH,
    QUEUE_DROPPED,
    QUEUE_WAIT,
    RESUMES,
    LocalValues,
    SharedValues,
    Values,
)
from gateway.routing.health import ProviderHealth
from gateway.routing.hedging import Hedging
from providers.contract.usage import Usage

__all__ = ["INFLIGHT", "LocalValues", "Metrics", "SharedValues"]  # what others import here
CIRCUIT_VALUES = {"closed": 0, "half_open": 1, "open": 2, "cooling_down": 3}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


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
        # With several workers, their shared values (None: this process's alone): the runtime
        # tells its gauges of every request only then (`add_inflight`).
        self.shared = SharedValues(self._registry) if multiprocess_dir() else None
        self.values: Values = self.shared or LocalValues()
        if isinstance(self.values, LocalValues):
            self._registry.register(_LocalCollector(self.values, inflight, queued))
            self._registry.register(_CircuitCollector(health))
            if hedging is not None:
                self._registry.register(_HedgingCollector(hedging))

    def add_inflight(self, delta: int) -> None:
        """This worker's in-flight count moved by `delta`; only several workers need telling."""
        if self.shared is not None:
            self.shared.inflight.inc(delta)

    def add_queued(self, delta: int) -> None:
        """This worker's queue depth moved by `delta`; only several workers need telling."""
        if self.shared is not None:
            self.shared.queued.inc(delta)

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
        values.answered(endpoint, model, provider, status, duration, ttft, upstream, attempts,
                        usage, cost)
        for attempt in failed:
            values.inc(FAILOVERS, (model, attempt.provider, attempt.reason))

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
        if self.shared is None:
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
