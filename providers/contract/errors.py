"""The errors a provider kind raises, the base every gateway error shares, and the one envelope
every error leaves in.

    GatewayError
     ├── ClientError                  the request is at fault; never failed over
     │    ├── InvalidRequest          400 invalid_request
     │    ├── NotFound                404 not_found (a route or an unknown id)
     │    └── UpstreamClientError     a provider's 4xx that is the client's fault, relayed
     ├── Overloaded                   503 overloaded: at the concurrency cap, and the queue full
     │                                or the request's turn past its deadline
     ├── ProviderError                one attempt at one provider failed; `retryable` says
     │    │                           whether the same provider may be tried again
     │    ├── ProviderUnavailable     refused / reset connection, 5xx
     │    │    └── PoolNotReady       a worker pool has no ready worker yet (loading)
     │    ├── ProviderTimeout
     │    │    ├── ConnectTimeout
     │    │    ├── FirstTokenTimeout
     │    │    ├── IdleTimeout
     │    │    └── TotalTimeout
     │    ├── ProviderRateLimited     429, carries `retry_after`
     │    ├── ProviderRejected        401/403/404 from the provider: its config, not the client's
     │    ├── BadUpstreamResponse     a body that is not what the protocol promises
     │    ├── ContextLengthExceeded   the prompt is too long for this model's window: a
     │    │                           larger window may take it
     │    └── ContentRefused          this model's content policy refused the request
     └── (the errors only the gateway raises: `gateway.core.errors`)

Every `ProviderError` moves the request to the next candidate. An error knows its status and
its headers (`Retry-After` from its `retry_after`); it leaves one way, as the body
`error_body()` shapes in the endpoint's dialect (OpenAI's envelope, or Anthropic's on the
Messages routes), or as the in-band event `error_event()` shapes once a stream has begun.
"""

from __future__ import annotations

import enum
import math
import re
from typing import Any, ClassVar

import msgspec


class GatewayError(Exception):
    """Base of every error the gateway reports to a client."""

    http_status: ClassVar[int] = 500
    error_type: ClassVar[str] = "api_error"
    code: ClassVar[str] = "internal_error"
    # Seconds the client should wait before retrying, when the error knows (`Retry-After`).
    retry_after: float | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    @property
    def status(self) -> int:
        """The HTTP status this error leaves with."""
        return self.http_status

    def headers(self) -> dict[str, str]:
        """The response headers this error leaves with: `Retry-After` on a 429 or 503 that
        knows when to come back, in whole seconds, at least one."""
        if self.retry_after is None or self.status not in (429, 503):
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

    def body(self) -> dict[str, Any]:
        """The `error` object of the envelope."""
        return {"message": self.message, "type": self.error_type, "code": self.code,
                "param": self.param}


class ClientError(GatewayError):
    """The request itself is wrong; trying another provider would not help."""

    http_status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class InvalidRequest(ClientError):
    """The body is not JSON, has wrong types, or misses a required field."""

    @classmethod
    def from_msgspec(cls, exc: Exception) -> InvalidRequest:
        """The error for msgspec's complaint about the body, its `param` the place it names
        (`messages[0].content`, `n`)."""
        message = str(exc)
        at = _AT.search(message)
        missing = _MISSING.search(message)
        parts = [p for p in (at.group(1) if at else "", missing.group(1) if missing else "") if p]
        return cls(f"Invalid request: {message}", param=".".join(parts) or None)


_AT = re.compile(r"- at `\$\.?([^`]*)`")
_MISSING = re.compile(r"required field `(\w+)`")


class NotFound(ClientError):
    """No such route or object."""

    http_status = 404
    code = "not_found"


# The `type`s OpenAI's clients know; servers built on FastAPI (vLLM) send exception class names.
OPENAI_ERROR_TYPES = frozenset({"invalid_request_error", "authentication_error",
                                "permission_error", "not_found_error", "rate_limit_error",
                                "conflict_error", "unprocessable_entity_error"})
_CLASS_NAME_TYPES = {"BadRequestError": "invalid_request_error",
                     "AuthenticationError": "authentication_error",
                     "PermissionDeniedError": "permission_error",
                     "NotFoundError": "not_found_error",
                     "UnprocessableEntityError": "invalid_request_error"}


def client_error_type(upstream_type: str | None) -> str:
    """An upstream's error type as OpenAI spells it; unknown ones are the client's bad request."""
    if upstream_type in OPENAI_ERROR_TYPES:
        return upstream_type
    return _CLASS_NAME_TYPES.get(upstream_type or "", "invalid_request_error")


class UpstreamClientError(ClientError):
    """A provider rejected the request as the client's fault; relayed with its status."""

    def __init__(self, provider: str, status: int, message: str, *, error_type: str | None,
                 code: str | None, param: str | None) -> None:
        super().__init__(message, param=param)
        self.provider = provider
        self._status = status
        self._type = client_error_type(error_type)
        self._code = code or "invalid_request"

    @property
    def status(self) -> int:
        return self._status

    def body(self) -> dict[str, Any]:
        return {"message": self.message, "type": self._type, "code": self._code,
                "param": self.param}


class Overloaded(GatewayError):
    """This gateway process is at its concurrency cap and cannot queue the request (its queue is
    full, or the request's turn would come after its deadline); `retry_after` says when."""

    http_status = 503
    code = "overloaded"

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProviderError(GatewayError):
    """One attempt at one provider failed; the request moves on."""

    http_status = 502
    code = "provider_error"
    retryable: ClassVar[bool] = True
    trips_circuit: ClassVar[bool] = True  # counts as a failure of the provider's health
    reason: ClassVar[str] = "error"

    def __init__(self, message: str, *, upstream_status: int | None = None) -> None:
        super().__init__(message)
        self.upstream_status = upstream_status
        self.retry_after: float | None = None


class ProviderUnavailable(ProviderError):
    """The provider refused or dropped the connection, or answered 5xx."""

    reason = "unavailable"


class PoolNotReady(ProviderUnavailable):
    """A worker pool is still loading (or restarting) every worker: fail over now, no retry.

    Not a sign of ill health, so it does not count against the circuit: the pool is tried again
    by the very next request, and serves as soon as a worker is ready.
    """

    retryable = False
    trips_circuit = False
    reason = "not_ready"


class ModelLoading(PoolNotReady):
    """Every worker that serves the model is still loading it: a 503 `model_loading` with
    `Retry-After` when no other provider answers."""

    reason = "model_loading"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PoolFull(ProviderError):
    """Every worker that serves the model holds all it may and its line is full (`max_queue`),
    or the request waited its turn in vain: fail over now; with no other provider, a 503
    `overloaded` whose Retry-After is what the line measured of its pace. Busy is not ill."""

    retryable = False
    trips_circuit = False
    reason = "pool_full"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ProviderTimeout(ProviderError):
    """A configured timeout fired."""

    http_status = 504
    reason = "timeout"


class ConnectTimeout(ProviderTimeout):
    """No connection within `timeouts.connect`."""

    reason = "connect_timeout"


class FirstTokenTimeout(ProviderTimeout):
    """No response headers and first chunk within `timeouts.first_token`."""

    reason = "first_token_timeout"


class IdleTimeout(ProviderTimeout):
    """The gap between two chunks exceeded `timeouts.idle`."""

    reason = "idle_timeout"


class TotalTimeout(ProviderTimeout):
    """The whole exchange exceeded `timeouts.total`."""

    reason = "total_timeout"


class ProviderRateLimited(ProviderError):
    """The provider answered 429."""

    http_status = 429
    reason = "rate_limited"

    def __init__(self, message: str, *, upstream_status: int | None = 429,
                 retry_after: float | None = None) -> None:
        super().__init__(message, upstream_status=upstream_status)
        self.retry_after = retry_after


class ProviderRejected(ProviderError):
    """The provider refused us (401/403/404): a config problem, not worth retrying there."""

    retryable = False
    reason = "rejected"


class BadUpstreamResponse(ProviderError):
    """The provider's body broke the protocol: not JSON, not SSE."""

    reason = "bad_response"


class AnsweredWhole(BadUpstreamResponse):
    """A stream was asked for and a whole JSON answer came (some servers ignore `stream`): a
    failover for a client reading a stream, the answer itself for one that asked for it whole
    (`payload`)."""

    def __init__(self, payload: bytes) -> None:
        super().__init__("answered JSON to a streaming request")
        self.payload = payload


class ModelLimit(ProviderError):
    """A 4xx that is no fault of the request as such but of this model: another model may
    answer it. Not the provider's ill health, and never tried again on the same model; when
    no other candidate answers, the upstream's own error (`relayed`) goes to the client."""

    retryable = False
    trips_circuit = False

    def __init__(self, relayed: UpstreamClientError) -> None:
        super().__init__(relayed.message, upstream_status=relayed.status)
        self.relayed = relayed


class ContextLengthExceeded(ModelLimit):
    """The upstream said the request does not fit its model's context window."""

    reason = "context_length_exceeded"


class ContentRefused(ModelLimit):
    """The upstream's content policy refused the request (or filtered the answer before any
    of it was written)."""

    reason = "content_policy"


class Dialect(enum.Enum):
    """Whose error shape an endpoint speaks."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


# Anthropic's error types by status; anything else is an `api_error`.
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 409: "invalid_request_error",
                   413: "request_too_large", 422: "invalid_request_error",
                   429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


def error_body(error: GatewayError, dialect: Dialect = Dialect.OPENAI) -> bytes:
    """The error's JSON body: OpenAI's `{"error": {...}}`, or Anthropic's
    `{"type": "error", "error": {type, message}}` with the field at fault starting the message,
    as Anthropic writes it."""
    if dialect is Dialect.OPENAI:
        return msgspec.json.encode({"error": error.body()})
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return msgspec.json.encode({"type": "error", "error": {
        "type": ANTHROPIC_TYPES.get(error.status, "api_error"), "message": message}})


def error_event(error: GatewayError, dialect: Dialect = Dialect.OPENAI) -> bytes:
    """The in-band SSE event for a stream that breaks after its first byte."""
    prefix = b"event: error\n" if dialect is Dialect.ANTHROPIC else b""
    return prefix + b"data: " + error_body(error, dialect) + b"\n\n"
