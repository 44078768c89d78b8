"""A real OTLP/HTTP trace receiver on a loopback socket: what a collector would get.

It decodes each `POST /v1/traces` body as the protobuf `ExportTraceServiceRequest` (the
`opentelemetry-proto` classes) and keeps every span, flattened, so tests can wait for a trace
and assert its tree. It answers as a collector does: 200 with an empty export response.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as ProtoStatus

SERVER = ProtoSpan.SpanKind.SPAN_KIND_SERVER
CLIENT = ProtoSpan.SpanKind.SPAN_KIND_CLIENT
ERROR = ProtoStatus.StatusCode.STATUS_CODE_ERROR


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as Python's."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


@dataclass(frozen=True)
class Received:
    """One span as the receiver got it."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    status: int
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    service: str

    @property
    def failed(self) -> bool:
        return self.status == ERROR


class OtlpReceiver:
    """`start()` it, point the gateway at `endpoint`, `stop()` it."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.exports = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and \
                    self.headers.get("content-type") == "application/x-protobuf"
                if ok:
                    receiver.keep(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    @property
    def endpoint(self) -> str:
        """The base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it."""
        return f"http://127.0.0.1:{self.port}"

    def keep(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(Received(
                        span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        span.name, span.kind,
                        {a.key: value_of(a.value) for a in span.attributes},
                        span.status.code, span.status.message,
                        [(e.name, {a.key: value_of(a.value) for a in e.attributes})
                         for e in span.events],
                        str(resource.get("service.name"))))
        with self._lock:
            self.spans.extend(found)
            self.exports += 1

    def trace(self, request_id: str, until: Callable[[list[Received]], bool] = lambda _: True,
              within: float = 10.0) -> list[Received]:
        """The spans of the trace whose server span served `request_id`, once `until` holds
        of them (its server span is always waited for); AssertionError after `within` s."""
        deadline = time.monotonic() + within
        while True:
            with self._lock:
                spans = list(self.spans)
            server = [s for s in spans
                      if s.kind == SERVER and s.attributes.get("llms.request_id") == request_id]
            if server:
                found = [s for s in spans if s.trace_id == server[0].trace_id]
                if until(found):
                    return found
            if time.monotonic() > deadline:
                raise AssertionError(f"no complete trace for {request_id} within {within}s: "
                                     f"{[(s.name, s.attributes) for s in spans]}")
            time.sleep(0.02)

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def children(spans: list[Received], parent: Received) -> list[Received]:
    """The spans directly under `parent`."""
    return [s for s in spans if s.parent_id == parent.span_id]


def one(spans: list[Received], **where: Any) -> Received:
    """The one span with these attributes (`name=`, `kind=` match the span's own fields)."""
    found = [s for s in spans if all(
        (getattr(s, k) if k in ("name", "kind") else s.attributes.get(k)) == v
        for k, v in where.items())]
    assert len(found) == 1, (where, [(s.name, s.attributes) for s in spans])
    return found[0]
