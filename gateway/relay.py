"""The path of one relayed request: check, route, try, answer, log once.

Shared by every relay route (chat, completions, responses, embeddings, messages); endpoint
differences live in the request heads (`schemas`), the bridges and the provider kinds, not here.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol, TypeVar

from litestar.types import Receive

from gateway import assemble, auth, cache, embeddings, messages, router, schemas, strategy
from gateway.cache import Cached
from gateway.config import Route
from gateway.disconnect import ClientDisconnected, DisconnectGuard
from gateway.responses.bridge import ResponsesBridge
from gateway.services import Services
from gateway.streaming import (
    UNREADABLE_ANSWER,
    OpenedStream,
    close_quietly,
    open_stream,
    relay,
    unreadable,
)
from providers.contract.errors import (
    AllProvidersFailed,
    Attempt,
    GatewayError,
    KeyRateLimited,
    Overloaded,
    ResponseNotFound,
    envelope,
    sse_error_event,
)
from providers.contract.log import get_logger
from providers.contract.messages import CountTokensRequest, MessagesRequest
from providers.contract.provider import Outgoing, Provider, Reply, decode_body
from providers.contract.usage import Usage, from_payload
from providers.contract.usage import cost as cost_of

HEADS: Mapping[str, type[Any]] = {
    "chat/completions": schemas.ChatHead,
    "completions": schemas.CompletionHead,
    "responses": schemas.ResponsesHead,
    "embeddings": schemas.EmbeddingsHead,
    "messages": MessagesRequest,
    "messages/count_tokens": CountTokensRequest,
}
# Endpoints answered by a bridge where a provider does not speak them natively.
BRIDGED = frozenset({"responses", *messages.ENDPOINTS})
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_REQUEST_ID = 128


@dataclass(frozen=True, slots=True)
class Whole:
    """A whole answer, its body bytes as they will be sent.

    `after` (the log line and metrics) runs once the answer is written: that work is not the
    client's to wait for."""

    body: bytes
    headers: Mapping[str, str]
    status: int = 200
    media_type: str = "application/json"
    after: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Streamed:
    """A committed stream: its chunks (the first already at hand) and its headers. The chunks'
    generator records how the stream ended (completed, error, client_disconnected) when it is
    closed, so whoever sends it must close it (`streaming.close_quietly`)."""

    chunks: AsyncGenerator[bytes, None]
    headers: Mapping[str, str]
    status: int = 200
    media_type: str = "text/event-stream"
    # Told why, when the gateway itself ends the stream early (a shutdown's drain ran out).
    interrupted: Callable[[str], None] | None = None
    # How a failure after the first byte is told, in the endpoint's own event shape.
    error_event: Callable[[GatewayError], bytes] = sse_error_event


def request_id(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` if it sent a sane one, else a new one."""
    sent = headers.get("x-request-id")
    if sent and len(sent) <= MAX_REQUEST_ID and sent.isprintable():
        return sent
    return os.urandom(12).hex()


@dataclass(slots=True)
class Exchange:
    """What one request did: its response headers, and its one ending (log line, metrics)."""

    services: Services
    request_id: str
    endpoint: str
    started: float = field(default_factory=time.perf_counter)
    model: str | None = None
    stream: bool = False
    provider: str | None = None
    attempts: int = 0
    failed: tuple[Attempt, ...] = ()
    status: int = 200
    key_id: str | None = None
    usage: Usage | None = None
    cost: float | None = None
    ttft: float | None = None
    upstream_time: float | None = None
    ended: bool = False
    outcome: str | None = None  # how it ended: completed, error, client_disconnected
    hedged: bool = False

    def headers(self) -> dict[str, str]:
        headers = {"x-request-id": self.request_id}
        if self.attempts:
            headers["x-llms-attempts"] = str(self.attempts)
        if self.provider:
            headers["x-llms-provider"] = self.provider
        if self.cost is not None:
            headers["x-llms-cost"] = f"{self.cost:.6f}"
        if self.hedged:
            headers["x-llms-hedged"] = "1"
        return headers

    def served(self, served: router.Served[Any]) -> None:
        self.provider, self.attempts, self.failed = (served.provider, served.attempts,
                                                     served.failed)
        self.hedged = served.hedged

    def used(self, usage: Usage | None) -> None:
        """What the answer used: priced, and counted against the client's key."""
        self.usage = usage
        if usage is None:
            return
        price = self.services.live.prices.get((self.provider or "", self.model or ""))
        if price is not None:
            self.cost = cost_of(usage, price)
        if self.key_id is not None:
            self.services.limiter.spend_tokens(self.key_id, usage.total_tokens)

    def completed(self) -> None:
        """A whole answer was sent."""
        self.finish("completed")

    def finish(self, outcome: str, **extra: Any) -> None:
        """Log the request and record its metrics, once."""
        if self.ended:
            return
        self.ended = True
        self.outcome = outcome
        duration = time.perf_counter() - self.started
        routes = self.services.live.snapshot.routes
        model_label = self.model if self.model is not None and self.model in routes else "_unknown"
        self.services.metrics.record(
            endpoint=self.endpoint, model=model_label, provider=self.provider,
            status=self.status, duration=duration, ttft=self.ttft,
            upstream=self.upstream_time, failed=self.failed, attempts=self.attempts,
            usage=self.usage, cost=self.cost)
        services = self.services
        client_error = 400 <= self.status < 500 and self.status != 499
        services.traffic.add(duration, ok=self.status < 500 and outcome != "error",
                             client_error=client_error, cache_hit=self.provider == "cache",
                             hedged=self.hedged)
        for attempt in self.failed:
            services.provider_traffic.failed(attempt.provider)
        if self.provider is not None and self.provider != "cache" and self.status < 400:
            services.provider_traffic.served(
                self.provider, self.ttft if self.stream else self.upstream_time, self.cost)
        self.services.request_log.write({
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "model": self.model,
            "provider": self.provider,
            "status": self.status,
            "outcome": outcome,
            "attempts": self.attempts,
            "failed": [f"{a.provider}:{a.reason}" for a in self.failed] or None,
            "stream": self.stream,
            "key_id": self.key_id,
            "tokens": self.usage.total_tokens if self.usage else None,
            "cost": round(self.cost, 8) if self.cost is not None else None,
            "ttft_ms": round(self.ttft * 1000, 2) if self.ttft is not None else None,
            "latency_ms": round(duration * 1000, 2),
            **extra,
        })
        if self.services.trace is not None:
            self.services.trace("logged")


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed every check: its parsed head, the body to send, its candidates."""

    head: Any
    raw: bytes
    routes: tuple[Route, ...]
    providers: Mapping[str, Provider]


async def _admit(request: Incoming, endpoint: str, services: Services,
                 exchange: Exchange) -> Admitted:
    """Key, limits, body, routing: everything decided before an upstream is called (the head's
    size and the body's deadline were checked by `guard`, in front of every route)."""
    live = services.live
    server = live.snapshot.server
    key = auth.check(request.headers, live.snapshot)
    if key is not None:
        exchange.key_id = key.limits.key_id
        if (wait := services.limiter.admit(key.limits)) is not None:
            raise KeyRateLimited(f"Rate limit reached for key {key.limits.key_id}; "
                                 f"retry in {wait:.0f}s", retry_after=wait)
    if services.inflight > server.max_concurrency:  # this request holds a slot too
        raise Overloaded("The gateway is at its concurrency limit; retry shortly")
    head, raw = schemas.parse(await request.body(), HEADS[endpoint])
    exchange.model, exchange.stream = head.model, bool(getattr(head, "stream", False))
    routes = router.candidates(live.snapshot, head.model)
    providers = live.providers
    if endpoint == embeddings.ENDPOINT:
        routes = embeddings.embedding_routes(head.model, routes, providers)
    if endpoint in BRIDGED:
        providers = services.bridged_providers(endpoint)
    routes = strategy.ordered(head.model, routes, live.snapshot.policy(head.model).routing,
                              services.spread, services.latencies)
    if endpoint == "responses":
        await _check_previous_response(services, head, routes, providers)
    return Admitted(head, raw, routes, providers)


class Incoming(Protocol):
    """What the relay reads of a request (`front.RawRequest`)."""

    scope: Any
    receive: Receive

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def body(self) -> bytes: ...


async def handle(request: Incoming, endpoint: str, services: Services) -> Whole | Streamed:
    """Serve one relay request end to end; every failure leaves as the error envelope.

    The caller holds the request's in-flight slot (`Services.enter`) for as long as the answer
    is being sent, a stream included."""
    exchange = Exchange(services, request_id(request.headers), endpoint)
    try:
        admitted = await _admit(request, endpoint, services, exchange)
        if services.trace is not None:
            services.trace("admitted")
        head, routes, providers = admitted.head, admitted.routes, admitted.providers
        options = getattr(head, "stream_options", None)
        outgoing = Outgoing(endpoint, admitted.raw, head.model, exchange.stream,
                            exchange.request_id,
                            client_wants_usage=bool(options and options.include_usage)
                            or endpoint in messages.ENDPOINTS,
                            key_id=exchange.key_id)
        caching = _caching(request.headers, endpoint, services, admitted, exchange)
        if caching is not None and caching.read:
            found = await services.cache.get(caching.key)
            if found is None:
                services.metrics.cache_lookup(caching.model, "miss")
            elif (hit := _hit(found, exchange, outgoing)) is not None:
                return hit
        hedge_after = services.live.snapshot.policy(head.model).routing.hedge_after
        async with DisconnectGuard(request.receive):
            if exchange.stream:
                choices = getattr(head, "n", None) or 1
                opened = await router.attempt(
                    head.model, routes, providers,
                    lambda p, m: _open(p, outgoing, m, choices, services), services.health,
                    _hedging(hedge_after, exchange, _close_opened))
            else:
                answered = await router.attempt(head.model, routes, providers,
                                                lambda p, m: _send(p, outgoing, m, exchange),
                                                services.health,
                                                _hedging(hedge_after, exchange, _nothing))
    except GatewayError as exc:
        return _error(exc, exchange)
    except ClientDisconnected:
        exchange.status = 499
        exchange.finish("client_disconnected")
        return Whole(b"", {}, status=499)
    except Exception:  # a bug: logged with its traceback and counted, as every request is
        return _internal_error(exchange)
    if not exchange.stream:
        exchange.served(answered)
        exchange.used(answered.result.usage)
        if caching is not None and caching.write:
            await _keep(services, caching, Cached(endpoint, answered.provider, caching.expires,
                                                  body=answered.result.body), exchange)
        return Whole(answered.result.body, exchange.headers(),
                     media_type=answered.result.content_type, after=exchange.completed)
    exchange.served(opened)
    exchange.ttft = time.perf_counter() - exchange.started
    streamed = _stream(exchange, opened, outgoing)
    if caching is not None and caching.write:
        streamed = replace(streamed, chunks=_kept_stream(streamed.chunks, services, caching,
                                                         exchange, outgoing))
    return streamed


T = TypeVar("T")


def _hedging(after: float | None, exchange: Exchange,
             discard: Callable[[T], Awaitable[None]]) -> router.Hedging[T] | None:
    if after is None:
        return None
    model = exchange.model or ""
    return router.Hedging(after, discard,
                          lambda result: exchange.services.metrics.hedge(model, result))


async def _close_opened(opened: OpenedStream) -> None:
    await close_quietly(opened.rest)


async def _nothing(_: Reply) -> None:
    """A whole answer that lost a race holds nothing open."""


@dataclass(frozen=True, slots=True)
class Caching:
    """A cacheable request: its key, whether the client lets it be read and written, and
    when what it stores expires."""

    key: str
    read: bool
    write: bool
    expires: float
    model: str


def _caching(headers: Mapping[str, str], endpoint: str, services: Services,
             admitted: Admitted, exchange: Exchange) -> Caching | None:
    policy = services.live.snapshot.policy(admitted.head.model).cache
    if not policy.ttl or endpoint not in cache.ENDPOINTS:
        return None
    read, write = cache.bypassed(headers)
    key = cache.key_of(endpoint, admitted.head.model, decode_body(admitted.raw),
                       exchange.key_id)
    if not read:
        services.metrics.cache_lookup(admitted.head.model, "bypass")
    return Caching(key, read, write, time.time() + policy.ttl, admitted.head.model)


def _hit(found: Cached, exchange: Exchange, outgoing: Outgoing) -> Whole | Streamed | None:
    """The kept answer in the shape the client asked for; None (a miss) if it cannot be."""
    metrics = exchange.services.metrics
    model = exchange.model or ""
    kept = cache.stream_of(found, outgoing.client_wants_usage) if exchange.stream \
        else cache.whole_of(found)
    if kept is None:
        metrics.cache_lookup(model, "miss")
        return None
    metrics.cache_lookup(model, "hit")
    exchange.provider = "cache"  # its own label: the provider's numbers stay the provider's
    headers = {**exchange.headers(), "x-llms-provider": found.provider, "x-llms-cache": "hit"}
    if not exchange.stream:
        exchange.usage = from_payload(kept)
        return Whole(kept, headers, after=exchange.completed)
    exchange.ttft = time.perf_counter() - exchange.started
    return Streamed(_replay(kept, exchange), {**headers, **STREAM_HEADERS})


async def _replay(chunks: bytes, exchange: Exchange) -> AsyncGenerator[bytes, None]:
    outcome = "client_disconnected"
    try:
        yield chunks
        outcome = "completed"
    finally:
        exchange.usage = from_payload(chunks.rsplit(b"data: ", 2)[-2]) \
            if b'"usage"' in chunks else None
        exchange.finish(outcome, cache="hit")


async def _keep(services: Services, caching: Caching, cached: Cached,
                exchange: Exchange) -> None:
    if exchange.status == 200 and (size := await services.cache.put(caching.key, cached)):
        services.metrics.cache_stored(caching.model, size)


async def _kept_stream(chunks: AsyncGenerator[bytes, None], services: Services,
                       caching: Caching, exchange: Exchange,
                       outgoing: Outgoing) -> AsyncGenerator[bytes, None]:
    """The stream as it goes to the client, kept once it completed (and if it fits)."""
    sent: list[bytes] = []
    size = 0
    limit = services.cache.max_entry_bytes
    try:
        async for chunk in chunks:
            if size <= limit:
                sent.append(chunk)
                size += len(chunk)
            yield chunk
    finally:
        await close_quietly(chunks)
    if exchange.outcome == "completed" and size <= limit:
        await _keep(services, caching, Cached(
            exchange.endpoint, exchange.provider or "", caching.expires, chunks=b"".join(sent),
            stream_usage=outgoing.client_wants_usage), exchange)


def internal_error(request: Incoming, endpoint: str, services: Services) -> Whole:
    """The answer to a bug that escaped `handle`, called where it is caught: logged with its
    traceback and request id, counted as a 500 in the metrics and the request log."""
    return _internal_error(Exchange(services, request_id(request.headers), endpoint))


def _internal_error(exchange: Exchange) -> Whole:
    get_logger().exception("unhandled_error", request_id=exchange.request_id,
                           endpoint=exchange.endpoint)
    return _error(GatewayError("Internal gateway error"), exchange)


def _stream(exchange: Exchange, opened: router.Served[OpenedStream],
            outgoing: Outgoing) -> Streamed:
    def ended(outcome: str, usage: Usage | None) -> None:
        exchange.used(usage)
        exchange.finish(outcome)

    error_event = messages.error_event if exchange.endpoint in messages.ENDPOINTS \
        else sse_error_event
    return Streamed(relay(opened.result, opened.provider, on_end=ended,
                          strip_usage=not outgoing.client_wants_usage,
                          redactor=exchange.services.live.redactor, error_event=error_event),
                    {**exchange.headers(), **STREAM_HEADERS},
                    interrupted=lambda reason: exchange.finish("error", reason=reason),
                    error_event=error_event)


async def _check_previous_response(services: Services, head: Any, routes: tuple[Route, ...],
                                   providers: Mapping[str, Provider]) -> None:
    """An id the gateway holds continues there; others may belong to a native upstream."""
    previous = getattr(head, "previous_response_id", None)
    if previous is None or await services.responses.get(previous) is not None:
        return
    native = [p for r in routes if (p := providers.get(r.provider)) is not None
              and not isinstance(p, ResponsesBridge)]
    if not native:
        raise ResponseNotFound(previous)


@contextlib.contextmanager
def _reading(provider: Provider) -> Iterator[None]:
    try:
        yield
    except UNREADABLE_ANSWER as exc:
        raise unreadable(provider.name, exc) from None


async def _open(provider: Provider, outgoing: Outgoing, upstream_model: str,
                choices: int, services: Services) -> OpenedStream:
    started = time.perf_counter()
    with _reading(provider):
        opened = await open_stream(provider.stream(outgoing, upstream_model), choices)
    router.first_token()
    services.latencies.observe(provider.name, upstream_model, time.perf_counter() - started)
    return opened


async def _send(provider: Provider, outgoing: Outgoing, upstream_model: str,
                exchange: Exchange) -> Reply:
    trace = exchange.services.trace
    if trace is not None:
        trace("provider")
    started = time.perf_counter()
    try:
        with _reading(provider):
            if outgoing.endpoint == embeddings.ENDPOINT:
                reply = await embeddings.send(provider, outgoing, upstream_model)
            elif assemble.streams_upstream(provider, outgoing):
                reply = await assemble.send(provider, outgoing, upstream_model)
            else:
                reply = await provider.send(outgoing, upstream_model)
    finally:  # the last try is the one that answered: its time is the upstream's share
        exchange.upstream_time = time.perf_counter() - started
        if trace is not None:
            trace("reply")
    # A whole answer's first token came at the latest with its end: the bound is what is known.
    exchange.services.latencies.observe(provider.name, upstream_model, exchange.upstream_time)
    return reply


def _error(exc: GatewayError, exchange: Exchange) -> Whole:
    exchange.status = exc.status
    headers = exchange.headers()
    if isinstance(exc, AllProvidersFailed):
        exchange.attempts, exchange.failed = len(exc.attempts), exc.attempts
        headers["x-llms-attempts"] = str(len(exc.attempts))
        if exc.retry_after is not None and exc.status in (429, 503):
            headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    elif isinstance(exc, Overloaded):
        headers["Retry-After"] = "1"
    elif isinstance(exc, KeyRateLimited):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    shaped = messages.error_body if exchange.endpoint in messages.ENDPOINTS else envelope
    body = exchange.services.live.redactor.encoded(shaped(exc))
    return Whole(body, headers, status=exc.status,
                 after=partial(exchange.finish, "error", error=exc.code))

