"""The transport with a span per upstream call, and `traceparent` on it: a `Transport` layer.

Used only when tracing is on (the app wraps the process's one transport in it). A call made
while a sampled request's span is current (a try's, `gateway.adapters.traced`) gets an HTTP
client span under it, from the request until the answer is closed, and carries that span's
`traceparent`, so an upstream that traces (vLLM) continues the trace. A call of a request not
sampled carries the headers `Tracing.serving` made for it once (`UNSAMPLED`: its
`traceparent`, sampled flag off), and no span. Calls outside a traced request (health checks,
model discovery) pass through untouched. No URL query, credential or body is recorded.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from providers.contract.errors import GatewayError
from providers.contract.redact import mask_credentials
from providers.contract.transport import DIRECT, HttpResponse, Link, Transport, UpstreamSocket

# The key, in OpenTelemetry's context, of the headers every upstream call of a request not
# sampled carries (set by `Tracing.serving`); absent outside one.
UNSAMPLED = context.create_key("llms-unsampled")


class TracedTransport(Transport):
    """`inner`, each call under a traced request in a client span of its own."""

    def __init__(self, inner: Transport, tracer: trace.Tracer) -> None:
        self.inner = inner
        self.tracer = tracer

    def request(self, method: str, url: str, *, headers: Mapping[str, str],
                body: bytes | None = None, link: Link = DIRECT, connect_timeout: float = 10.0,
                compressed: bool = True) -> Coroutine[Any, Any, HttpResponse]:
        # Not a coroutine itself: a call with no span is the inner transport's, one frame less.
        passed = context.get_value(UNSAMPLED)
        if isinstance(passed, dict):  # a request not sampled: its trace passed on, no span
            return self.inner.request(method, url, headers={**headers, **passed}, body=body,
                                      link=link, connect_timeout=connect_timeout,
                                      compressed=compressed)
        if not trace.get_current_span().is_recording():  # no traced request: as it is
            return self.inner.request(method, url, headers=headers, body=body, link=link,
                                      connect_timeout=connect_timeout, compressed=compressed)
        return self._traced(method, url, headers, body, link, connect_timeout, compressed)

    async def _traced(self, method: str, url: str, headers: Mapping[str, str],
                      body: bytes | None, link: Link, connect_timeout: float,
                      compressed: bool) -> HttpResponse:
        span = self.tracer.start_span(method, kind=SpanKind.CLIENT,
                                      attributes=_url_attributes(method, url))
        carrier = dict(headers)
        propagate.inject(carrier, trace.set_span_in_context(span))
        try:
            answer = await self.inner.request(method, url, headers=carrier, body=body,
                                              link=link, connect_timeout=connect_timeout,
                                              compressed=compressed)
        except BaseException as exc:
            _failed(span, exc)
            raise
        span.set_attribute("http.response.status_code", answer.status)
        if answer.status >= 400:
            span.set_status(Status(StatusCode.ERROR, str(answer.status)))
        return _TracedResponse(answer, span)

    def websocket(self, url: str, *, headers: Mapping[str, str], link: Link = DIRECT,
                  connect_timeout: float = 10.0, max_frame_bytes: int = 4 << 20
                  ) -> Coroutine[Any, Any, UpstreamSocket]:
        # A Realtime session's socket: its span is the session's own (`gateway.realtime`).
        return self.inner.websocket(url, headers=headers, link=link,
                                    connect_timeout=connect_timeout,
                                    max_frame_bytes=max_frame_bytes)

    def prepare(self, link: Link, provider: str) -> None:
        self.inner.prepare(link, provider)

    async def close(self) -> None:
        await self.inner.close()


@functools.lru_cache(maxsize=1024)
def _url_attributes(method: str, url: str) -> Mapping[str, str | int]:
    """The call's method and where it went: scheme, host, port, path (no query, no user).
    Kept per URL (a provider calls a few, over and over); the SDK copies what it is given."""
    parts = urlsplit(url)
    found: dict[str, str | int] = {
        "http.request.method": method,
        "url.full": f"{parts.scheme}://{parts.hostname or ''}"
                    f"{f':{parts.port}' if parts.port else ''}{parts.path}"}
    if parts.hostname:
        found["server.address"] = parts.hostname
    if parts.port:
        found["server.port"] = parts.port
    return found


def _failed(span: Span, exc: BaseException) -> None:
    """The call's error on its span (the gateway's own message, credentials masked)."""
    if span.is_recording():
        if isinstance(exc, GatewayError):
            message = mask_credentials(exc.message)
            span.add_event("exception", {"exception.type": type(exc).__name__,
                                         "exception.message": message})
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, message))
        elif isinstance(exc, Exception):
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        span.end()


class _TracedResponse:
    """An upstream answer whose span ends when it is closed; a failed read fails the span."""

    __slots__ = ("inner", "span")

    def __init__(self, inner: HttpResponse, span: Span) -> None:
        self.inner = inner
        self.span = span

    @property
    def status(self) -> int:
        return self.inner.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self.inner.headers

    async def read(self, limit: int | None = None) -> bytes:
        try:
            return await self.inner.read(limit)
        except BaseException as exc:
            _failed(self.span, exc)
            raise

    def readany(self) -> Awaitable[bytes]:
        return self._readany()

    async def _readany(self) -> bytes:
        try:
            return await self.inner.readany()
        except BaseException as exc:
            _failed(self.span, exc)
            raise

    def set_exception(self, exc: BaseException) -> None:
        self.inner.set_exception(exc)

    def close(self) -> None:
        self.inner.close()
        if self.span.is_recording():
            self.span.end()
