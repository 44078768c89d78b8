"""The gateway's errors, and the one envelope every error leaves in.

    GatewayError
     ├── ClientError                  the request is at fault; never failed over
     │    ├── InvalidRequest          400 invalid_request
     │    ├── RequestTooLarge         413 request_too_large
     │    ├── ModelNotFound           404 model_not_found
     │    ├── ResponseNotFound        404 response_not_found (previous_response_id)
     │    ├── ContextTooLong          400 context_length_exceeded: no candidate's window fits
     │    ├── NotFound                404 not_found (a route or an unknown id)
     │    ├── MethodNotAllowed        405 method_not_allowed
     │    ├── KeyRateLimited          429 rate_limit_exceeded: this key's per-minute limit
     │    ├── BudgetExceeded          429 budget_exceeded: the key's or its team's budget
     │    ├── ModelNotAllowed         403 model_not_allowed: an alias the key may not use
     │    ├── Conflict                409 conflict: an admin change that clashes (a taken name)
     │    ├── RequestTimeout          408 request_timeout: the body did not arrive in time
     │    ├── HeadersTooLarge         431 headers_too_large
     │    ├── AuthenticationFailed    401 invalid_api_key
     │    ├── PermissionDenied        403 permission_denied: a valid key, not allowed here
     │    ├── IdempotencyKeyReused    422 idempotency_key_reused: the key sent with another body
     │    ├── IdempotencyKeyBusy      409 idempotency_key_in_use: too many retries wait on it
     │    └── UpstreamClientError     a provider's 4xx that is the client's fault, relayed
     ├── Overloaded                   503 overloaded: at the concurrency cap, and the queue full
 │                                or the request's turn past its deadline
 ├── QueueTimeout                 504 queue_timeout: its deadline passed while it waited
     ├── DatabaseUnavailable          503 database_unavailable: an admin route the database must
     │                                answer, while it is down
     ├── ShuttingDown                 503 server_shutting_down: a stream the drain ended
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
     │    ├── CircuitOpen             its breaker opened between two retries
     │    ├── BadUpstreamResponse     a body that is not what the protocol promises
     │    ├── ContextLengthExceeded   the prompt is too long for this model's window: a
     │    │                           larger window may take it
     │    └── ContentRefused          this model's content policy refused the request
     └── AllProvidersFailed           every candidate failed: 502, or 429 / 504 when all failed so

Every `ProviderError` moves the request to the next candidate. An error knows its status and
its headers (`Retry-After` from its `retry_after`); it leaves one way, as the body
`error_body()` shapes in the endpoint's dialect (OpenAI's envelope, or Anthropic's on the
Messages routes), or as the in-band event `error_event()` shapes once a stream has begun.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
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


class RequestTooLarge(ClientError):
    """The body is over the configured limit."""

    http_status = 413
    code = "request_too_large"


class ModelNotFound(ClientError):
    """No enabled provider serves the requested model."""

    http_status = 404
    code = "model_not_found"

    def __init__(self, model: str, disabled: Sequence[tuple[str, str | None]] = ()) -> None:
        """`disabled`: the providers that list the model but are disabled, and why."""
        message = f"Model '{model}' not found in any enabled provider"
        if disabled:
            why = ", ".join(f"{name} ({reason or 'disabled'})" for name, reason in disabled)
            message += f"; it is listed by disabled providers: {why}"
        super().__init__(message, param="model")


class ResponseNotFound(ClientError):
    """`previous_response_id` names a response this gateway does not have."""

    http_status = 404
    code = "response_not_found"

    def __init__(self, response_id: str, param: str | None = "previous_response_id") -> None:
        super().__init__(f"Response '{response_id}' not found", param=param)


class NotFound(ClientError):
    """No such route or object."""

    http_status = 404
    code = "not_found"


class MethodNotAllowed(ClientError):
    """The route exists but not for this method."""

    http_status = 405
    code = "method_not_allowed"


class KeyRateLimited(ClientError):
    """This gateway key used its requests or tokens for the minute."""

    http_status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BudgetExceeded(ClientError):
    """The request's worst-case cost does not fit in its key's or its team's budget."""

    http_status = 429
    error_type = "rate_limit_error"
    code = "budget_exceeded"

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ModelNotAllowed(ClientError):
    """The key may not use the model it asked for (whether the model exists is not said)."""

    http_status = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class Conflict(ClientError):
    """An admin change clashes with what exists: a name taken, a team that still has keys."""

    http_status = 409
    error_type = "conflict_error"
    code = "conflict"


class RequestTimeout(ClientError):
    """The declared body did not arrive within `server.body_timeout`."""

    http_status = 408
    code = "request_timeout"


class HeadersTooLarge(ClientError):
    """The request headers are over the limit."""

    http_status = 431
    code = "headers_too_large"


class AuthenticationFailed(ClientError):
    """The gateway key is missing or wrong."""

    http_status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(ClientError):
    """The caller is known but may not use this route (a client key on an admin route)."""

    http_status = 403
    error_type = "permission_error"
    code = "permission_denied"


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


class IdempotencyKeyReused(ClientError):
    """An `Idempotency-Key` this key already used on this endpoint, sent with another body."""

    http_status = 422
    code = "idempotency_key_reused"


class IdempotencyKeyBusy(ClientError):
    """A retry of a running request that finds its bound of waiting retries reached."""

    http_status = 409
    code = "idempotency_key_in_use"


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


class QueueTimeout(GatewayError):
    """The request waited in the gateway's queue until its deadline passed (`x-llms-timeout`,
    its key's `timeout`, or `server.queue_timeout`) without its turn coming."""

    http_status = 504
    code = "queue_timeout"


class DatabaseUnavailable(GatewayError):
    """The accounts database cannot be reached: an admin change cannot be kept (requests with
    known keys are still served)."""

    http_status = 503
    code = "database_unavailable"

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(GatewayError):
    """The worker is stopping and its drain time ran out: sent in-band to a cut stream."""

    http_status = 503
    code = "server_shutting_down"


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


class CircuitOpen(ProviderError):
    """The provider's circuit opened while this request waited to retry it."""

    retryable = False
    reason = "circuit_open"


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


class ContextTooLong(ClientError):
    """No candidate's context window can hold the request: the largest one tried is named."""

    code = "context_length_exceeded"

    def __init__(self, model: str, largest: int | None, needed: int | None) -> None:
        window = f"the largest context window tried is {largest} tokens" if largest \
            else "every candidate said it is too long"
        asked = f" (about {needed} tokens with the requested output)" if needed else ""
        super().__init__(f"The request is too long for model '{model}'{asked}: {window}; "
                         "reduce the length of the messages or of the requested output",
                         param="messages")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try at one provider, as reported in `provider_error`."""

    provider: str
    status: int | None
    reason: str
    message: str
    retry_after: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "status": self.status, "reason": self.reason,
                "message": self.message}


class AllProvidersFailed(GatewayError):
    """Every candidate for the model failed; lists what each attempt saw."""

    http_status = 502
    code = "provider_error"

    def __init__(self, model: str, attempts: Sequence[Attempt]) -> None:
        tried = "; ".join(f"{a.provider}: {a.reason}" + (f" {a.status}" if a.status else "")
                          for a in attempts)
        super().__init__(f"All providers failed for model '{model}'" + (f" ({tried})" if tried
                                                                         else ""))
        self.attempts = tuple(attempts)
        self.retry_after = min((a.retry_after for a in attempts if a.retry_after), default=None)
        # A content policy's refusal among them: what the client gets when nothing answered.
        self.refused: UpstreamClientError | None = None

    @property
    def loading(self) -> bool:
        """Every try found the model still loading."""
        return bool(self.attempts) and {a.reason for a in self.attempts} == {"model_loading"}

    @property
    def full(self) -> bool:
        """Every try found its pool full."""
        return bool(self.attempts) and {a.reason for a in self.attempts} == {"pool_full"}

    @property
    def status(self) -> int:
        reasons = {a.reason for a in self.attempts}
        if reasons == {"rate_limited"}:
            return 429
        if self.loading or self.full:
            return 503
        if reasons and all(r.endswith("timeout") for r in reasons):
            return 504
        return 502

    def body(self) -> dict[str, Any]:
        body = super().body()
        if self.loading:
            body["code"] = "model_loading"
        elif self.full:
            body["code"] = "overloaded"
        body["attempts"] = [a.as_dict() for a in self.attempts]
        return body


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
