"""Prometheus metrics, recorded once per request when it ends (`record`).

Labels are bounded: model aliases from the config (an unknown model is `_unknown`), provider
names, endpoints, statuses and failure reasons. Never a user string, never a key. With
`--workers N` the CLI points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory and `/metrics`
aggregates every worker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.errors import Attempt
from gateway.state import ProviderHealth
from gateway.usage import Usage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)
CIRCUIT_VALUES = {"closed": 0, "half_open": 1, "open": 2, "cooling_down": 3}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


class Metrics:
    """Every metric the gateway exports, in a registry of its own."""

    def __init__(self, health: ProviderHealth) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("llms_requests", "Requests by endpoint, model, provider, status",
                                ["endpoint", "model", "provider", "status"], registry=r)
        self.latency = Histogram("llms_request_duration_seconds",
                                 "End-to-end time, to the last byte for streams",
                                 ["model", "provider"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("llms_time_to_first_token_seconds",
                              "Streams: time until the first chunk reached the client",
                              ["model", "provider"], buckets=LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("llms_gateway_overhead_seconds",
                                  "Non-streamed answers: total time minus upstream time",
                                  buckets=OVERHEAD_BUCKETS, registry=r)
        self.failovers = Counter("llms_failovers", "Failed tries that moved a request on",
                                 ["model", "provider", "reason"], registry=r)
        self.attempts = Histogram("llms_attempts_per_request", "Tries per answered request",
                                  buckets=(1, 2, 3, 4, 6, 10), registry=r)
        self.tokens = Counter("llms_tokens", "Tokens by kind (prompt, completion, reasoning)",
                              ["model", "provider", "kind"], registry=r)
        self.cost = Counter("llms_cost_usd", "Cost at the prices in llms.json",
                            ["model", "provider"], registry=r)
        self.inflight = Gauge("llms_inflight_requests", "Requests holding an upstream",
                              registry=r, multiprocess_mode="livesum")
        self._health = health
        # Label lookups cost a lock and a dict walk each; the label sets are bounded, so the
        # children are kept (the hot path does one dict lookup per family).
        self._requests: dict[tuple[str, str, str, int], Any] = {}
        self._served: dict[tuple[str, str], _Served] = {}
        if multiprocess_dir() is None:
            r.register(_CircuitCollector(health))

    def watch_inflight(self, read: Callable[[], int]) -> bool:
        """In one process the in-flight gauge reads `read()` when scraped, so requests need not
        move it; False with several workers, where each adds its own share (`inflight.inc`)."""
        if multiprocess_dir() is not None:
            return False
        self.inflight.set_function(read)
        return True

    def record(self, *, endpoint: str, model: str, provider: str | None, status: int,
               duration: float, ttft: float | None, upstream: float | None,
               failed: Iterable[Attempt], attempts: int, usage: Usage | None,
               cost: float | None) -> None:
        """Count one finished request."""
        counted = (endpoint, model, provider or "none", status)
        if (requests := self._requests.get(counted)) is None:
            requests = self._requests[counted] = self.requests.labels(*counted[:3], str(status))
        requests.inc()
        for attempt in failed:
            self.failovers.labels(model, attempt.provider, attempt.reason).inc()
        if provider is None:
            return
        if (served := self._served.get((model, provider))) is None:
            served = self._served[(model, provider)] = _Served(self, model, provider)
        served.latency.observe(duration)
        self.attempts.observe(attempts)
        if ttft is not None:
            served.ttft.observe(ttft)
        if upstream is not None:
            self.overhead.observe(max(0.0, duration - upstream))
        if usage is not None:
            served.prompt_tokens.inc(usage.prompt_tokens)
            served.completion_tokens.inc(usage.completion_tokens)
            if usage.reasoning_tokens:
                served.reasoning_tokens.inc(usage.reasoning_tokens)
        if cost:
            served.cost.inc(cost)

    def exposition(self) -> bytes:
        """The text `/metrics` serves: this process, or every worker's when there are several."""
        if multiprocess_dir() is None:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        multiprocess.MultiProcessCollector(combined)
        combined.register(_CircuitCollector(self._health))
        return generate_latest(combined)


class _Served:
    """The metric children of one (model, provider)."""

    __slots__ = ("completion_tokens", "cost", "latency", "prompt_tokens", "reasoning_tokens",
                 "ttft")

    def __init__(self, metrics: Metrics, model: str, provider: str) -> None:
        self.latency = metrics.latency.labels(model, provider)
        self.ttft = metrics.ttft.labels(model, provider)
        self.prompt_tokens = metrics.tokens.labels(model, provider, "prompt")
        self.completion_tokens = metrics.tokens.labels(model, provider, "completion")
        self.reasoning_tokens = metrics.tokens.labels(model, provider, "reasoning")
        self.cost = metrics.cost.labels(model, provider)


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
