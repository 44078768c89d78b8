"""Head sampling: whether a trace the gateway starts is kept, decided before the SDK is asked.

A request that comes with no trace context starts a trace, and at a busy gateway's ratio (1%)
most are not kept. For those, the OpenTelemetry SDK's work (a span object, its sampler, a
context attached, the propagators formatting `traceparent` on every upstream call) was most of
what tracing cost a request. So the gateway draws the trace id itself, keeps it by the rule
the SDK's `TraceIdRatioBased` uses (its low 64 bits under `ratio * 2**64`, so a service with
the same ratio decides alike), and for a trace not kept writes the upstream's `traceparent`
(sampled flag off) once, by hand. The SDK sees the traces kept only, and makes their root with
the trace id drawn here (`DrawnIds`). A client's trace context is still the SDK's to continue.

The rule is `telemetry.sample_ratio` (parent-based), else `OTEL_TRACES_SAMPLER` and
`OTEL_TRACES_SAMPLER_ARG` read as the SDK reads them; a sampler the specification does not
name (an entry point's) is left to the SDK for every trace (`rule` is None).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import propagate
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

LOW_BITS = (1 << 64) - 1  # what TraceIdRatioBased compares: the trace id's low 64 bits
# The propagators whose header for a trace of the gateway's own, not kept, is `traceparent`
# alone (no client's `tracestate`, no baggage): the default, W3C trace context and baggage.
W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})
_RATIOS = {"always_on": 1.0, "always_off": 0.0, "parentbased_always_on": 1.0,
           "parentbased_always_off": 0.0}
_BY_ARG = ("traceidratio", "parentbased_traceidratio")


@dataclass(frozen=True, slots=True)
class Rule:
    """How traces are sampled: the share kept of those the gateway starts, and whether a
    client's trace is followed (parent-based) or decided by its trace id alike."""

    ratio: float
    parent_based: bool = True


def rule(sample_ratio: float | None, environ: Mapping[str, str]) -> Rule | None:
    """The sampling rule from llms.json's `sample_ratio`, else the environment's sampler (its
    default: parent-based, every trace kept); None for a sampler the SDK must run itself."""
    if sample_ratio is not None:
        return Rule(sample_ratio)
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    parent_based = name.startswith("parentbased_")
    if name in _RATIOS:
        return Rule(_RATIOS[name], parent_based)
    if name in _BY_ARG:
        return Rule(_ratio_arg(environ.get("OTEL_TRACES_SAMPLER_ARG")), parent_based)
    return None


def _ratio_arg(arg: str | None) -> float:
    """OTEL_TRACES_SAMPLER_ARG as the SDK takes it: a ratio in [0, 1], else every trace."""
    try:
        ratio = float(arg) if arg is not None else 1.0
    except ValueError:
        return 1.0
    return ratio if 0.0 <= ratio <= 1.0 else 1.0


def sdk_sampler(found: Rule) -> Sampler:
    """The SDK's sampler once the gateway decides its own traces: a root it is asked for is
    kept (decided already); a client's trace as the rule says."""
    if found.parent_based:
        return ParentBased(ALWAYS_ON)
    by_id = TraceIdRatioBased(found.ratio)  # always_on, always_off, traceidratio: the id's
    return ParentBased(ALWAYS_ON, remote_parent_sampled=by_id, remote_parent_not_sampled=by_id)


class DrawnIds(RandomIdGenerator):
    """The SDK's ids, but a root's trace id is the one the head sampler drew for it (`drawn`,
    set right before the span is started, in the same synchronous step)."""

    def __init__(self) -> None:
        self.drawn = 0

    def generate_trace_id(self) -> int:
        drawn, self.drawn = self.drawn, 0
        return drawn or super().generate_trace_id()


class Head:
    """The decision for a trace the gateway starts, and the headers one not kept passes on."""

    __slots__ = ("bound", "flags", "ids", "w3c")

    def __init__(self, found: Rule, ids: DrawnIds, propagated: frozenset[str]) -> None:
        self.bound = TraceIdRatioBased.get_bound_for_rate(found.ratio)
        self.ids = ids
        self.w3c = propagated <= W3C_FIELDS
        # Not sampled; "random trace id" (W3C Trace Context level 2) where the SDK says so of
        # its ids, as it would for this trace.
        self.flags = TraceFlags(TraceFlags.DEFAULT)
        if hasattr(TraceFlags, "RANDOM_TRACE_ID") and ids.is_trace_id_random():
            self.flags = TraceFlags(TraceFlags.RANDOM_TRACE_ID)

    def draw(self) -> int:
        """A new trace's id (never the invalid 0)."""
        trace_id = random.getrandbits(128)
        while not trace_id:
            trace_id = random.getrandbits(128)
        return trace_id

    def kept(self, trace_id: int) -> bool:
        """Whether the trace is sampled: the rule of `TraceIdRatioBased`."""
        return trace_id & LOW_BITS < self.bound

    def passed(self, trace_id: int) -> dict[str, str]:
        """What each upstream call of a trace not kept carries: its `traceparent`, a span id
        of its own, sampled flag off, as the SDK would write it (through the configured
        propagators when they are not the W3C ones)."""
        span_id = random.getrandbits(64) or 1
        if self.w3c:
            return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{self.flags:02x}"}
        carrier: dict[str, str] = {}
        span = NonRecordingSpan(SpanContext(trace_id, span_id, False, self.flags))
        propagate.inject(carrier, set_span_in_context(span))
        return carrier
