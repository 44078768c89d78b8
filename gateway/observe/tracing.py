"""OpenTelemetry traces: a server span per relayed request, named and filled from its record.

Off unless `telemetry.otlp_endpoint` (llms.json) or `OTEL_EXPORTER_OTLP_ENDPOINT` is set; then
`configure` builds the process's tracer (the SDK, a batch processor, the OTLP/HTTP protobuf
exporter). Off, nothing here runs, nor is it even imported (the app, the runtime and the
admission load it only when on): `Runtime.tracing` is None, so there is no listener, no
adapter, no transport layer and no span. The tree one request makes (docs/observability.md):

    chat gpt-4o-mini              SERVER   opened by the edge (`serving`), continuing a client's
    │                                      `traceparent`; named and filled here, at the record's end
    ├── llms.cache.lookup                  `TracedCache`
    ├── chat gpt-4o-mini-2024     CLIENT   one per try (`gateway.adapters.traced`)
    │   └── POST                  CLIENT   the upstream call, carrying `traceparent`
    │                                      (`gateway.observe.traced_transport`)
    └── llms.hedge                         a second candidate started beside a slow first
        └── chat other-model      CLIENT   its try

Which requests are traced is decided once, at the server span (`Tracing.serving`): a trace the
gateway starts is kept or not by its own head sampler (`gateway.observe.traced_sampling`), in
front of the SDK, so a request not kept costs a random id and a header, and no span at all. A
sampled request's `RequestTrace` rides in OpenTelemetry's own context (`opentelemetry.context`,
`current`) beside its span, so the tries the router starts in tasks of their own (hedges) find
both, and their spans are siblings.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gateway.core.record import Listener, Outcome, Record
from gateway.core.settings import Telemetry
from gateway.observe.observers import CLIENT_CLOSED, status_of
from gateway.observe.traced_sampling import DrawnIds, Head, rule, sdk_sampler
from gateway.observe.traced_transport import UNSAMPLED, TracedTransport
from providers.contract.transport import Transport

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

SERVICE = "llms-gateway"
TRACES_PATH = "/v1/traces"
# What each endpoint is called by the GenAI semantic conventions (`gen_ai.operation.name`).
OPERATIONS: Mapping[str, str] = {
    "chat/completions": "chat", "completions": "text_completion", "responses": "chat",
    "embeddings": "embeddings", "messages": "chat", "messages/count_tokens": "count_tokens"}


@dataclass(slots=True)
class Try:
    """One try at a provider, as its attempt span left it (the winner's is the answer's)."""

    provider: str
    kind: str
    upstream_model: str
    outcome: str = "pending"
    finish_reasons: tuple[str, ...] = ()


@dataclass(slots=True)
class RequestTrace:
    """What one sampled request's spans share: the server span, its tries, how many are in
    flight (a try started while another is: a hedge). A request not sampled has none."""

    span: Span
    tries: list[Try] = field(default_factory=list)
    inflight: int = 0


_STATE = context.create_key("llms-request-trace")


def current() -> RequestTrace | None:
    """The sampled request this code runs for, if any."""
    found = context.get_value(_STATE)
    return found if isinstance(found, RequestTrace) else None


@dataclass(frozen=True, slots=True)
class Tracing:
    """The process's tracer and what it records; built once, at start (`configure`)."""

    provider: TracerProvider
    tracer: trace.Tracer
    capture_content: bool = False
    max_content_bytes: int = 8 * 1024
    # The headers a client's trace context comes in (`OTEL_PROPAGATORS`'), read once.
    fields: frozenset[str] = field(
        default_factory=lambda: frozenset(propagate.get_global_textmap().fields))
    # The gateway's own traces kept or not before the SDK is asked; None: the SDK's sampler
    # (one the specification does not name) decides every trace.
    head: Head | None = None

    def serving(self, headers: Mapping[str, str], endpoint: str
                ) -> contextlib.AbstractContextManager[None]:
        """The request's server span, current while the edge serves it (its answer, a stream
        included): a client's `traceparent` is continued, anything else starts a trace.

        Sampling is decided here, once. A trace not sampled makes no other span and no
        `RequestTrace`, which is what every other layer looks for: only the headers its
        upstream calls carry (`traceparent`, sampled flag off) are made current. One the
        gateway starts makes no span at all (`head`); a client's goes through the SDK."""
        client = not self.fields.isdisjoint(headers)
        if not client and self.head is not None:
            trace_id = self.head.draw()
            if not self.head.kept(trace_id):
                return _Passing(self.head.passed(trace_id))
            return self._spanned(None, endpoint, trace_id)
        return self._spanned(propagate.extract(headers) if client else None, endpoint)

    @contextlib.contextmanager
    def _spanned(self, parent: context.Context | None, endpoint: str,
                 drawn: int = 0) -> Iterator[None]:
        operation = OPERATIONS.get(endpoint, endpoint)
        if drawn and self.head is not None:  # the root's id, taken by the SDK's next call
            self.head.ids.drawn = drawn
        span = self.tracer.start_span(operation, parent, SpanKind.SERVER,
                                      {"gen_ai.operation.name": operation,
                                       "http.route": f"/v1/{endpoint}"})
        if not span.is_recording():  # the client's trace, not sampled: passed on as such
            carrier: dict[str, str] = {}
            propagate.inject(carrier, trace.set_span_in_context(span, parent))
            with _Passing(carrier):
                yield
            return
        state = RequestTrace(span)
        token = context.attach(context.set_value(_STATE, state,
                                                 trace.set_span_in_context(span, parent)))
        try:
            yield
        except BaseException as exc:  # cancelled (a shutdown), or a bug past the relay's net
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            context.detach(token)
            span.end()

    def transport(self, inner: Transport) -> Transport:
        """The process's transport, each upstream call in a span carrying `traceparent`."""
        return TracedTransport(inner, self.tracer)

    async def close(self) -> None:
        """Export what is still queued and stop (the exporter's own timeout bounds it)."""
        await asyncio.to_thread(self.provider.shutdown)


class _Passing:
    """While a request not sampled is served: the headers its upstream calls carry
    (`TracedTransport`). A class, not a generator: it is what most requests pay."""

    __slots__ = ("headers", "token")

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def __enter__(self) -> None:
        self.token = context.attach(context.set_value(UNSAMPLED, self.headers))

    def __exit__(self, *_: object) -> None:
        context.detach(self.token)


def configure(telemetry: Telemetry, environ: Mapping[str, str]) -> Tracing | None:
    """The process's tracing, or None when neither llms.json nor the environment names an
    OTLP endpoint (or `OTEL_SDK_DISABLED` / `OTEL_TRACES_EXPORTER=none` turn it off)."""
    if not telemetry.wanted(environ):
        return None
    # The SDK and its exporter are loaded by a gateway that traces, only.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    endpoint = None  # the exporter reads the environment's itself, with its rules
    if telemetry.otlp_endpoint:
        endpoint = telemetry.otlp_endpoint.rstrip("/")
        if not endpoint.endswith(TRACES_PATH):
            endpoint += TRACES_PATH
    name = telemetry.service_name or environ.get("OTEL_SERVICE_NAME") or SERVICE
    ids, found = DrawnIds(), rule(telemetry.sample_ratio, environ)
    # None: the SDK reads OTEL_TRACES_SAMPLER itself (a sampler of an entry point's).
    sampler = sdk_sampler(found) if found is not None else None
    provider = TracerProvider(sampler=sampler, resource=Resource.create({SERVICE_NAME: name}),
                              id_generator=ids)
    # The schedule delay, queue and batch sizes: OTEL_BSP_* from the environment.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    fields = frozenset(propagate.get_global_textmap().fields)
    head = Head(found, ids, fields) if found is not None else None
    return Tracing(provider, provider.get_tracer(SERVICE), telemetry.capture_content,
                   telemetry.max_content_bytes, fields, head)


def server_spans() -> Listener:
    """The server span, named and filled from the record when the request ends (it ends once
    the edge has sent the answer). The listener runs where the record ends: in the request's
    own task, under the context `Tracing.serving` made."""
    def ended(record: Record) -> None:
        state = current()
        if state is None or not state.span.is_recording():  # not sampled, or ended already
            return
        span, alias = state.span, record.model
        operation = OPERATIONS.get(record.endpoint, record.endpoint)
        if alias is not None:
            span.update_name(f"{operation} {alias}")
        status = status_of(record)
        attributes = _attributes(record, status)
        if alias is not None:
            attributes["gen_ai.request.model"] = alias
        served = _served(state, record)
        if served is not None:
            attributes["gen_ai.response.model"] = served.upstream_model
            attributes["gen_ai.provider.name"] = served.kind
            if served.finish_reasons:
                attributes["gen_ai.response.finish_reasons"] = list(served.finish_reasons)
        span.set_attributes(attributes)  # one call: the SDK takes its lock once
        if record.outcome is Outcome.ERROR or (status >= 500 and status != CLIENT_CLOSED):
            span.set_status(Status(StatusCode.ERROR, record.error_code or "error"))
    return ended


def _attributes(record: Record, status: int) -> dict[str, str | bool | int | float | list[str]]:
    found: dict[str, str | bool | int | float | list[str]] = {
        "http.response.status_code": status,
        "llms.request_id": record.request_id,
        "llms.stream": record.stream,
        "llms.attempts": record.attempts,
        "llms.cache_hit": record.cache_hit,
        "llms.hedged": record.hedged,
        "llms.outcome": record.outcome.value if record.outcome else "unknown",
    }
    if record.hedged:  # each attribute costs its check and its encoding: none that says nothing
        found["llms.hedge_won"] = record.hedge_won
    if record.key_id is not None:
        found["llms.key_id"] = record.key_id
    if (alias := record.alias or record.model) is not None:  # the alias that served it
        found["llms.alias"] = alias
    if record.resumes is not None and (record.resumes.ok or record.resumes.failed):
        found["llms.resumed"] = record.resumes.ok
        found["llms.resumes_failed"] = record.resumes.failed
    if record.provider is not None:
        found["llms.provider"] = record.provider
    if record.failed:
        found["llms.failed"] = [f"{a.provider}:{a.reason}" for a in record.failed]
    if record.cost is not None:
        found["llms.cost"] = record.cost
    if record.ttft is not None:
        found["llms.ttft"] = record.ttft
    if record.error_code is not None:
        found["error.type"] = record.error_code
    if record.usage is not None:
        found["gen_ai.usage.input_tokens"] = record.usage.prompt_tokens
        found["gen_ai.usage.output_tokens"] = record.usage.completion_tokens
    return found


def _served(state: RequestTrace, record: Record) -> Try | None:
    """The try whose answer the client got."""
    if record.provider is None or record.cache_hit:
        return None
    answered = [t for t in state.tries if t.provider == record.provider
                and t.outcome not in ("failed", "rejected", "cancelled", "pending")]
    return answered[-1] if answered else None
