"""A span per try: the outermost adapter when tracing is on (`gateway.observe.tracing`).

Each `answer()` the router calls opens an attempt span under the request's server span, current
while the try runs, so the span of the upstream call (`gateway.observe.traced_transport`) is
its child and the upstream gets the attempt's `traceparent`. A try started while another of the same
request is in flight is a hedge: it runs under an `llms.hedge` span of its own. The span ends
with the try: a failure (its failover reason, redacted), a whole answer, or, for a stream or
an answer still gathering, once that is read to its end, cut, or closed.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Collection, Coroutine
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from gateway.adapters.stack import Outermost
from gateway.observe.tracing import OPERATIONS, RequestTrace, Tracing, Try, current
from providers.contract.errors import GatewayError, ProviderError, UpstreamClientError
from providers.contract.provider import Answer, Gathering, Outgoing, Provider, Reply
from providers.contract.redact import Redactor, mask_credentials
from providers.contract.stream import Opened, SSEWatch, close_quietly

_FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([A-Za-z_]{1,40})"')
MAX_FINISH_REASONS = 16
SECRET_MARGIN = 4096  # read past the cut of recorded content, so no secret is cut in two


class Traced(Outermost):
    """`inner`, each try in an attempt span."""

    kind = "traced"

    def __init__(self, inner: Provider, tracing: Tracing, redactor: Redactor,
                 private_keys: Collection[str] = ()) -> None:
        super().__init__(inner)
        self.tracing = tracing
        self.redactor = redactor
        self.private_keys = private_keys
        self.endpoints = inner.endpoints

    def answer(self, request: Outgoing, upstream_model: str) -> Coroutine[Any, Any, Answer]:
        # Not a coroutine itself: a try not traced is the inner provider's, one frame less.
        state = current()
        if state is None:  # not traced, or not sampled: no span, nothing built
            return self.inner.answer(request, upstream_model)
        return self._traced(request, upstream_model, state)

    async def _traced(self, request: Outgoing, upstream_model: str,
                      state: RequestTrace) -> Answer:
        tracer = self.tracing.tracer
        hedge = tracer.start_span("llms.hedge") if state.inflight else None
        parent = trace.set_span_in_context(hedge) if hedge is not None else None
        operation = OPERATIONS.get(request.endpoint, request.endpoint)
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": operation, "gen_ai.request.model": upstream_model,
            "gen_ai.provider.name": self.spec.kind, "llms.provider": self.name,
            "llms.alias": request.model, "llms.stream": request.stream}
        if self._captures(request):
            attributes["gen_ai.input.messages"] = self.recorded(request.raw)
        span = tracer.start_span(f"{operation} {upstream_model}", parent, SpanKind.CLIENT,
                                 attributes)
        attempt = _Attempt(self, state, span, hedge,
                           Try(self.name, self.spec.kind, upstream_model))
        started = time.perf_counter()
        state.inflight += 1
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):
                answer = await self.inner.answer(request, upstream_model)
        except BaseException as exc:
            attempt.failed(exc)
            raise
        finally:
            state.inflight -= 1
        attempt.ending["llms.ttft"] = time.perf_counter() - started
        return attempt.answered(answer, self._captures(request))

    def _captures(self, request: Outgoing) -> bool:
        return self.tracing.capture_content and request.key_id not in self.private_keys

    def recorded(self, data: bytes) -> str:
        """Content as recorded: its first `max_content_bytes`, secrets removed before the cut
        (a secret cut in two would not be found)."""
        most = self.tracing.max_content_bytes
        text = data[:most + SECRET_MARGIN].decode("utf-8", "ignore")
        cleaned = self.redactor.text(mask_credentials(text)).encode()[:most]
        return cleaned.decode("utf-8", "ignore")


class _Attempt:
    """One try's spans, until the try is over. What is learnt on the way is kept in `ending`
    and set on the span once, as it ends: the SDK takes its lock and checks the values in
    one call."""

    __slots__ = ("adapter", "content", "ending", "hedge", "span", "state", "try_")

    def __init__(self, adapter: Traced, state: RequestTrace, span: Span, hedge: Span | None,
                 try_: Try) -> None:
        self.adapter = adapter
        self.state = state
        self.span = span
        self.hedge = hedge
        self.try_ = try_
        self.content = b""
        self.ending: dict[str, AttributeValue] = {}
        state.tries.append(try_)

    def failed(self, exc: BaseException) -> None:
        ending = self.ending
        if isinstance(exc, ProviderError):
            ending["llms.failover_reason"] = ending["error.type"] = exc.reason
            if exc.upstream_status is not None:
                ending["http.response.status_code"] = exc.upstream_status
            self._error(exc, "failed")
        elif isinstance(exc, UpstreamClientError):  # the client's error: no failover
            ending["http.response.status_code"] = exc.status
            self._error(exc, "rejected")
        elif isinstance(exc, GatewayError):
            self._error(exc, "failed")
        elif isinstance(exc, Exception):
            ending["error.type"] = type(exc).__name__
            self._end("failed", Status(StatusCode.ERROR, type(exc).__name__))
        else:  # cancelled: a hedge that lost, or a client that left
            self._end("cancelled")

    def _error(self, exc: GatewayError, outcome: str) -> None:
        message = self.adapter.redactor.text(mask_credentials(exc.message))
        self.span.add_event("exception", {"exception.type": type(exc).__name__,
                                          "exception.message": message})
        self._end(outcome, Status(StatusCode.ERROR, message))

    def answered(self, answer: Answer, captures: bool) -> Answer:
        self.try_.outcome = "answered"
        if isinstance(answer, Reply):
            self.whole(answer, captures)
            return answer
        if isinstance(answer, Opened):
            return _Opened(answer.head, self._stream(answer, captures), answer.watch,
                           answer.media_type, self)
        return _Gathering(answer, self, captures)

    def whole(self, reply: Reply, captures: bool) -> None:
        self._reasons(reply.body)
        if reply.usage is not None:
            self.ending["gen_ai.usage.input_tokens"] = reply.usage.prompt_tokens
            self.ending["gen_ai.usage.output_tokens"] = reply.usage.completion_tokens
        if captures:
            self.ending["gen_ai.output.messages"] = self.adapter.recorded(reply.body)
        self._end("completed")

    async def _stream(self, opened: Opened, captures: bool) -> AsyncIterator[bytes]:
        """The stream's rest as it passes: its finish reasons, and how it ended."""
        rest, watch = opened.rest, opened.watch
        limit = self.adapter.tracing.max_content_bytes + SECRET_MARGIN
        self._reasons(opened.head)
        if captures:
            self.content = opened.head[:limit]
        try:
            async for chunk in rest:
                if b"finish_reason" in chunk or b"stop_reason" in chunk:
                    self._reasons(chunk)
                if captures and len(self.content) < limit:
                    self.content += chunk[:limit - len(self.content)]
                yield chunk
        except GeneratorExit:  # let go of: after its end, or before (the client left)
            self._captured()
            self._ended_stream(watch, early="closed")
            raise
        except BaseException as exc:
            self._captured()
            self.failed(exc)
            raise
        finally:
            await close_quietly(rest)
        self._captured()
        self._ended_stream(watch)

    def _captured(self) -> None:
        if self.content:
            self.ending["gen_ai.output.messages"] = self.adapter.recorded(self.content)

    def _ended_stream(self, watch: SSEWatch, early: str | None = None) -> None:
        if watch.usage is not None:
            self.ending["gen_ai.usage.input_tokens"] = watch.usage.prompt_tokens
            self.ending["gen_ai.usage.output_tokens"] = watch.usage.completion_tokens
        if watch.done or watch.finished:
            self._end("completed")
        elif early is not None:
            self._end(early)
        else:
            self._end("cut", Status(StatusCode.ERROR, "stream ended before it finished"))

    def closed(self) -> None:
        """The answer was let go of before its end (a hedge's loser, a client that left)."""
        self._end("closed")

    def _reasons(self, data: bytes) -> None:
        found = self.try_.finish_reasons
        for reason in _FINISH.findall(data):
            name = reason.decode()
            if name not in found and len(found) < MAX_FINISH_REASONS:
                found = (*found, name)
        if found != self.try_.finish_reasons:
            self.try_.finish_reasons = found
            self.ending["gen_ai.response.finish_reasons"] = found

    def _end(self, outcome: str, status: Status | None = None) -> None:
        if not self.span.is_recording():  # ended already (or not sampled)
            if self.try_.outcome in ("pending", "answered"):
                self.try_.outcome = outcome
            return
        self.try_.outcome = outcome
        self.ending["llms.outcome"] = outcome
        self.span.set_attributes(self.ending)
        if status is not None:
            self.span.set_status(status)
        self.span.end()
        if self.hedge is not None:
            self.hedge.set_attributes({"llms.provider": self.try_.provider,
                                       "llms.outcome": outcome})
            if status is not None:
                self.hedge.set_status(status)
            self.hedge.end()


@dataclass(slots=True)
class _Opened(Opened):
    """An opened stream whose attempt span ends with it, even if it is closed unread (the
    answer of a hedge that lost)."""

    attempt: _Attempt | None = None

    async def close(self) -> None:
        if self.attempt is not None:
            self.attempt.closed()
        await close_quietly(self.rest)


class _Gathering(Gathering):
    """A whole answer still arriving, its attempt span open until it is whole."""

    def __init__(self, inner: Gathering, attempt: _Attempt, captures: bool) -> None:
        self.inner = inner
        self.attempt = attempt
        self.captures = captures

    async def reply(self) -> Reply:
        try:
            reply = await self.inner.reply()
        except BaseException as exc:
            self.attempt.failed(exc)
            raise
        self.attempt.whole(reply, self.captures)
        return reply

    async def close(self) -> None:
        self.attempt.closed()
        await self.inner.close()

