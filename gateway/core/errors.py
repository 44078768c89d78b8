"""The errors only the gateway raises, on the provider contract's `GatewayError`.

    GatewayError (providers.contract.errors)
     ├── ClientError
     │    ├── RequestTooLarge         413 request_too_large
     │    ├── ModelNotFound           404 model_not_found
     │    ├── ResponseNotFound        404 response_not_found (previous_response_id)
     │    ├── ContextTooLong          400 context_length_exceeded: no candidate's window fits
     │    ├── MethodNotAllowed        405 method_not_allowed
     │    ├── KeyRateLimited          429 rate_limit_exceeded: this key's per-minute limit
     │    ├── BudgetExceeded          429 budget_exceeded: the key's or its team's budget
     │    ├── ModelNotAllowed         403 model_not_allowed: an alias the key may not use
     │    ├── ModelUnpriced           403 model_unpriced: a budgeted key, a model with no price
     │    ├── Conflict                409 conflict: an admin change that clashes (a taken name)
     │    ├── RequestTimeout          408 request_timeout: the body did not arrive in time
     │    ├── HeadersTooLarge         431 headers_too_large
     │    ├── AuthenticationFailed    401 invalid_api_key
     │    ├── PermissionDenied        403 permission_denied: a valid key, not allowed here
     │    ├── IdempotencyKeyReused    422 idempotency_key_reused: the key sent with another body
     │    └── IdempotencyKeyBusy      409 idempotency_key_in_use: too many retries wait on it
     ├── QueueTimeout                 504 queue_timeout: its deadline passed while it waited
     ├── DatabaseUnavailable          503 database_unavailable: an admin route the database must
     │                                answer, while it is down
     ├── ShuttingDown                 503 server_shutting_down: a stream the drain ended
     ├── ProviderError
     │    └── CircuitOpen             its breaker opened between two retries
     └── AllProvidersFailed           every candidate failed: 502, or 429 / 504 when all failed so

Each leaves as every error does, shaped by `providers.contract.errors.error_body` in the
endpoint's dialect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from providers.contract.errors import ClientError, GatewayError, ProviderError, UpstreamClientError

# The longest `Retry-After` the OpenAI and Anthropic SDKs wait for before retrying themselves.
SDK_RETRY_WAIT = 60.0


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

    def headers(self) -> dict[str, str]:
        """`Retry-After`, and `x-should-retry: false` (which the OpenAI and Anthropic SDKs obey)
        unless the budget's window turns within the minute an SDK would wait."""
        soon = self.retry_after is not None and self.retry_after <= SDK_RETRY_WAIT
        return {**super().headers(), "x-should-retry": "true" if soon else "false"}


class ModelNotAllowed(ClientError):
    """The key may not use the model it asked for (whether the model exists is not said)."""

    http_status = 403
    error_type = "permission_error"
    code = "model_not_allowed"

    def headers(self) -> dict[str, str]:
        """`x-should-retry: false`: asking again cannot change the key's models."""
        return {"x-should-retry": "false"}


class ModelUnpriced(ClientError):
    """A budgeted key asked a model no price is known for, and `defaults.unpriced` refuses
    such models: it would be served free."""

    http_status = 403
    error_type = "permission_error"
    code = "model_unpriced"

    def headers(self) -> dict[str, str]:
        """`x-should-retry: false`: only the operator's edit of llms.json changes the answer."""
        return {"x-should-retry": "false"}


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


class IdempotencyKeyReused(ClientError):
    """An `Idempotency-Key` this key already used on this endpoint, sent with another body."""

    http_status = 422
    code = "idempotency_key_reused"


class IdempotencyKeyBusy(ClientError):
    """A retry of a running request that finds its bound of waiting retries reached."""

    http_status = 409
    code = "idempotency_key_in_use"


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


class CircuitOpen(ProviderError):
    """The provider's circuit opened while this request waited to retry it."""

    retryable = False
    reason = "circuit_open"


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
