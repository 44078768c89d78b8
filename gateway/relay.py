"""The path of one relayed request: check, route, try, answer, log once.

Shared by /v1/chat/completions, /v1/completions and /v1/responses; endpoint differences live in
the request heads (`schemas`) and in the provider kinds, not here.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from litestar import Request, Response
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import HTTPException
from litestar.response import Stream

from gateway import auth, router, schemas
from gateway.disconnect import ClientDisconnected, DisconnectGuard
from gateway.errors import (
    AllProvidersFailed,
    Attempt,
    GatewayError,
    HeadersTooLarge,
    KeyRateLimited,
    Overloaded,
    RequestTooLarge,
    envelope,
)
from gateway.logs import get_logger
from gateway.runtime import Gateway
from gateway.streaming import OpenedStream, close_quietly, open_stream, relay
from providers.base import Outgoing, Provider

HEADS: Mapping[str, type[schemas.ChatHead | schemas.CompletionHead | schemas.ResponsesHead]] = {
    "chat/completions": schemas.ChatHead,
    "completions": schemas.CompletionHead,
    "responses": schemas.ResponsesHead,
}
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_REQUEST_ID = 128


def request_id(headers: Mapping[str, str]) -> str:
    """The client's `x-request-id` if it sent a sane one, else a new one."""
    sent = headers.get("x-request-id")
    if sent and len(sent) <= MAX_REQUEST_ID and sent.isprintable():
        return sent
    return os.urandom(12).hex()


@dataclass(slots=True)
class Exchange:
    """What one request did, for its response headers and its one log line."""

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
    tokens: int | None = None

    def headers(self) -> dict[str, str]:
        headers = {"x-request-id": self.request_id}
        if self.attempts:
            headers["x-llms-attempts"] = str(self.attempts)
        if self.provider:
            headers["x-llms-provider"] = self.provider
        return headers

    def served(self, served: router.Served[Any]) -> None:
        self.provider, self.attempts, self.failed = (served.provider, served.attempts,
                                                     served.failed)

    def finished(self, gateway: Gateway, tokens: int | None) -> None:
        """Record what the answer used, against the client's key."""
        self.tokens = tokens
        if tokens and self.key_id is not None:
            gateway.limiter.spend_tokens(self.key_id, tokens)

    def log(self, outcome: str, **extra: Any) -> None:
        get_logger().info(
            "request",
            request_id=self.request_id,
            endpoint=self.endpoint,
            model=self.model,
            provider=self.provider,
            status=self.status,
            outcome=outcome,
            attempts=self.attempts,
            failed=[f"{a.provider}:{a.reason}" for a in self.failed] or None,
            stream=self.stream,
            key_id=self.key_id,
            tokens=self.tokens,
            latency_ms=round((time.perf_counter() - self.started) * 1000, 2),
            **extra,
        )


async def handle(request: Request[Any, Any, Any], endpoint: str) -> Response[Any]:
    """Serve one relay request end to end; every failure leaves as the error envelope."""
    gateway: Gateway = request.app.state.gateway
    runtime = gateway.runtime
    server = runtime.snapshot.server
    exchange = Exchange(request_id(request.headers), endpoint)
    try:
        if sum(len(k) + len(v) for k, v in request.scope["headers"]) > server.max_header_bytes:
            raise HeadersTooLarge("Request headers are larger than the gateway accepts")
        key = auth.check(request.headers, runtime.snapshot.keys)
        if key is not None:
            exchange.key_id = key.limits.key_id
            if (wait := gateway.limiter.admit(key.limits)) is not None:
                raise KeyRateLimited(f"Rate limit reached for key {key.limits.key_id}; "
                                     f"retry in {wait:.0f}s", retry_after=wait)
        if gateway.inflight >= server.max_concurrency:
            raise Overloaded("The gateway is at its concurrency limit; retry shortly")
        raw = await _body(request)
        head = schemas.parse(raw, HEADS[endpoint])
        exchange.model, exchange.stream = head.model, bool(head.stream)
        routes = router.candidates(runtime.snapshot, head.model)
    except GatewayError as exc:
        return _error(exc, exchange)
    outgoing = Outgoing(endpoint, raw, head.model, exchange.stream, exchange.request_id)
    gateway.inflight += 1
    streaming = False
    try:
        async with DisconnectGuard(request.receive):
            if exchange.stream:
                opened = await router.attempt(head.model, routes, runtime.providers,
                                              lambda p, m: _open(p, outgoing, m), gateway.health)
            else:
                answered = await router.attempt(head.model, routes, runtime.providers,
                                                lambda p, m: p.send(outgoing, m), gateway.health)
        if not exchange.stream:
            exchange.served(answered)
            exchange.finished(gateway, answered.result.total_tokens)
            exchange.log("completed")
            return Response(answered.result.body, media_type=answered.result.content_type,
                            headers=exchange.headers())
        exchange.served(opened)
        streaming = True
        return _stream(gateway, exchange, opened)
    except GatewayError as exc:
        return _error(exc, exchange)
    except ClientDisconnected:
        exchange.status = 499
        exchange.log("client_disconnected")
        return Response(b"", status_code=499)
    finally:
        if not streaming:
            gateway.inflight -= 1


def _stream(gateway: Gateway, exchange: Exchange,
            opened: router.Served[OpenedStream]) -> Stream:
    done = False

    def ended(outcome: str, tokens: int | None) -> None:
        nonlocal done
        if not done:
            done = True
            gateway.inflight -= 1
            exchange.finished(gateway, tokens)
            exchange.log(outcome)

    async def after() -> None:
        # Runs even when the client left before the body started, which skips the relay's
        # own cleanup: the upstream must still be closed and the request counted out.
        if not done:
            await close_quietly(opened.result.rest)
            ended("client_disconnected", None)

    return Stream(relay(opened.result, opened.provider, on_end=ended),
                  background=BackgroundTask(after), media_type="text/event-stream",
                  headers={**exchange.headers(), **STREAM_HEADERS})


async def _open(provider: Provider, outgoing: Outgoing, upstream_model: str) -> OpenedStream:
    return await open_stream(provider.stream(outgoing, upstream_model))


async def _body(request: Request[Any, Any, Any]) -> bytes:
    try:
        return await request.body()
    except HTTPException as exc:
        if exc.status_code == 413:
            raise RequestTooLarge("Request body is larger than the gateway accepts") from None
        raise


def _error(exc: GatewayError, exchange: Exchange) -> Response[bytes]:
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
    exchange.log("error", error=exc.code)
    return Response(envelope(exc), status_code=exc.status, media_type="application/json",
                    headers=headers)

