"""The listeners every request's record is told of when it ends (`gateway.core.record`).

Each turns a finished `Record` into what its sinks keep: Prometheus metrics, the recent traffic
the status page draws and the request log line (one listener: they share the request's labels),
a key's token spend, and with tracing on the request's server span
(`gateway.observe.tracing.server_spans`), and with accounts the request's charge: its budget
settled, its spend row (`gateway.accounts.service.Accounts.ended`). They are registered once, at
startup (`gateway.state.runtime.Runtime`), in the order here.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.limits import RateLimiter
from gateway.core.record import Listener, Outcome, Record
from gateway.core.settings import Route
from gateway.observe.logs import RequestLine, RequestLog
from gateway.observe.metrics import Metrics
from gateway.observe.traffic import ProviderTraffic, RecentTraffic, refusal
from gateway.routing.sorting import Throughputs
from providers.contract.provider import Resumes

# The status a request that lost its client before any answer is counted with (nginx's).
CLIENT_CLOSED = 499
CACHE = "cache"  # the provider label of answers served from the response cache
REPLAY = "replay"  # ... and of answers replayed for an `Idempotency-Key` retry
# Outcomes as module names, read for every request: on Python 3.11 a member read off its enum
# class goes through `EnumType.__getattr__`'s attribute hook, a call of its own each time.
_LEFT, _ERROR, _COMPLETED = Outcome.CLIENT_LEFT, Outcome.ERROR, Outcome.COMPLETED


def status_of(record: Record) -> int:
    """The status the request is counted and logged with."""
    if record.outcome is _LEFT and record.ttft is None:
        return CLIENT_CLOSED
    return record.status


def observed_by(metrics: Metrics, traffic: RecentTraffic, providers: ProviderTraffic,
                log: RequestLog) -> Listener:
    """Prometheus (requests, failovers, latencies, tokens, cost, hedges), the status page's
    recent traffic (the gateway's and each provider's) and the request's log line: one
    listener, so the labels they share are read once a request."""
    def ended(record: Record) -> None:
        # Who served (as metrics and the log name it), `status_of` and `Record.attempts`,
        # spelled out: a call each, for every request, where one read serves all three sinks.
        served, cache_hit, replayed = record.provider, record.cache_hit, record.replayed
        provider = CACHE if cache_hit else REPLAY if replayed else served
        outcome, ttft, failed = record.outcome, record.ttft, record.failed
        status = CLIENT_CLOSED if outcome is _LEFT and ttft is None else record.status
        attempts = len(failed) + (served is not None and not (cache_hit or replayed))
        # The alias, not the name sent: a pattern lets clients send any number of names.
        alias = record.alias
        model = alias if record.known_model and alias is not None else "_unknown"
        usage, cost, duration = record.usage, record.cost, record.duration
        metrics.record(
            endpoint=record.endpoint, model=model, provider=provider, status=status,
            duration=duration, ttft=ttft, upstream=record.upstream_time, failed=failed,
            attempts=attempts, usage=usage, cost=cost)
        if record.hedged:
            metrics.hedge(model, "started")
        if record.hedge_won:
            metrics.hedge(model, "won")
        resumes = record.resumes
        resumed = resumes if resumes is not None and (resumes.ok or resumes.failed) else None
        if resumed is not None:
            _resumed(metrics, model, resumed)
        # A 503 because every pool was loading or full is a wait, not a failure.
        refused = refusal((a.reason for a in failed), record.error_code) \
            if status >= 500 else None
        traffic.add(duration, ok=status < 500 and outcome is not _ERROR,
                    client_error=400 <= status < 500 and status != CLIENT_CLOSED,
                    cache_hit=cache_hit, hedged=record.hedged, refused=refused)
        for attempt in failed:
            providers.failed(attempt.provider, attempt.reason)
        if served is not None and not (cache_hit or replayed) and status < 400:
            providers.served(served, ttft if record.stream else record.upstream_time, cost)
        overhead = record.overhead
        # Only the fields with a value are passed: each keyword given for a field with a
        # default costs msgspec's init a search of its own.
        line = RequestLine(
            request_id=record.request_id, endpoint=record.endpoint, model=record.model,
            provider=provider, status=status, outcome=outcome, attempts=attempts,
            failed=[f"{a.provider}:{a.reason}" for a in failed] if failed else None,
            stream=record.stream, key_id=record.key_id,
            tokens=usage.total_tokens if usage else None,
            cost=round(cost, 8) if cost is not None else None,
            ttft_ms=_ms(ttft) if ttft is not None else None,
            latency_ms=_ms(duration),
            overhead_ms=_ms(overhead) if overhead is not None else None)
        if alias != record.model:
            line.alias = alias
        if record.error_code:
            line.error = record.error_code
        if cache_hit:
            line.cache = "hit"
        if replayed:
            line.idempotent = "replay"
        if resumed is not None:
            line.resumed, line.resumes_failed = resumed.ok + resumed.failed, resumed.failed
            line.resumed_by = resumed.by
        log.write(line, record.detail or None)
    return ended


def _resumed(metrics: Metrics, model: str, resumed: Resumes) -> None:
    for result, count in (("ok", resumed.ok), ("failed", resumed.failed)):
        if count:
            metrics.resumed(model, result, count)


def measured_by(throughputs: Throughputs, route_of: Callable[[str, str], Route | None]
                ) -> Listener:
    """Tokens per second of each completed stream (its output tokens over its time after the
    first token), for the `throughput` sort: a whole answer's time holds its prompt's too."""
    def ended(record: Record) -> None:
        if not record.stream or record.outcome is not _COMPLETED \
                or record.provider is None or record.from_store or record.usage is None:
            return
        tokens, seconds = record.usage.completion_tokens, record.duration - (record.ttft or 0.0)
        if tokens and seconds > 0 and record.alias is not None \
                and (route := route_of(record.alias, record.provider)) is not None:
            throughputs.observe(route.provider, route.upstream_model, tokens / seconds)
    return ended


def _ms(seconds: float) -> float:
    """Milliseconds to two decimals, rounded half up: `round(x, 2)` formats the float to a
    string and back, several times this."""
    return int(seconds * 100_000 + 0.5) / 100


def spent_by(limiter: RateLimiter) -> Listener:
    """A key's tokens (and its team's), counted against its per-minute token limit."""
    def ended(record: Record) -> None:
        if record.key_id is not None and record.usage is not None:
            limiter.spend_tokens(record.key_id, record.usage.total_tokens)
            if record.team is not None:
                limiter.spend_tokens(f"team:{record.team}", record.usage.total_tokens)
    return ended


def staged_by(trace: Callable[[str], None]) -> Listener:
    """The last stage a profiler hears (`bench/stages.py`)."""
    return lambda _: trace("logged")
