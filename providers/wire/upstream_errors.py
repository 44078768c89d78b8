"""What an upstream's error answer means: a failover decision or the client's own error.

An upstream status becomes one of the gateway's errors (`error_for_status`), with the wait its
headers ask for (`retry_after`); what the upstream said is read from whichever of the common
error shapes it used, cut short and scrubbed of anything that looks like a credential before a
client can see it (`scrub`). Pure: no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

import msgspec

from providers.contract.errors import (
    ContentRefused,
    ContextLengthExceeded,
    GatewayError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    UpstreamClientError,
)
from providers.contract.redact import mask_credentials
from providers.contract.refusals import Limit, classify

MAX_ERROR_MESSAGE = 500
MAX_ERROR_BODY = 64 * 1024
# Longer than any HTTP date: a header that long is not a Retry-After.
MAX_RETRY_AFTER_TEXT = 64


def scrub(text: str, secret: str | None = None) -> str:
    """Cut `text` short and mask credentials, including the provider's own key if given."""
    if secret:
        text = text.replace(secret, "***")
    text = mask_credentials(text)
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 1] + "…"


class _ErrorBody(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    code: str | int | None = None
    param: str | None = None


class _Envelope(msgspec.Struct):
    error: _ErrorBody | str | None = None
    message: str | None = None  # vLLM's old shape: {"object": "error", "message": ...}
    type: str | None = None
    param: str | None = None
    code: str | int | None = None
    detail: Any = None  # FastAPI-style validation errors


def read_error(body: bytes) -> _ErrorBody:
    """What an upstream error body says, whichever of the common shapes it uses."""
    try:
        env = msgspec.json.decode(body, type=_Envelope)
    except msgspec.DecodeError:
        text = body.decode("utf-8", "replace").strip()
        return _ErrorBody(message=text or None)
    if isinstance(env.error, _ErrorBody):
        return env.error
    if isinstance(env.error, str):
        return _ErrorBody(message=env.error, type=env.type, code=env.code, param=env.param)
    if env.message:
        return _ErrorBody(message=env.message, type=env.type, code=env.code, param=env.param)
    if env.detail is not None:
        return _ErrorBody(message=str(env.detail))
    return _ErrorBody()


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Parse a Retry-After header: delta-seconds or an HTTP date. What is neither (`inf`, `nan`,
    a negative number, `1_000`, a date the parser rejects) counts as absent; how long a hint is
    believed is capped where it is used (`Retries.max_retry_after`)."""
    if not value or len(value) > MAX_RETRY_AFTER_TEXT:
        return None
    # delta-seconds are ASCII digits (a fraction is tolerated); what else float() takes
    # ("inf", "-5", "1e999", "1_000", non-ASCII digits) is no wait.
    if (value := value.strip()).isascii() and value.replace(".", "", 1).isdigit():
        return float(value)  # at most 64 digits: always finite
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """An answer's wait hint: `retry-after-ms` (Azure OpenAI's and OpenAI's, finer) when it
    is a number of milliseconds, else `Retry-After`."""
    millis = (headers.get("retry-after-ms") or "").strip()
    if len(millis) <= MAX_RETRY_AFTER_TEXT and millis.isascii() \
            and millis.replace(".", "", 1).isdigit():
        return float(millis) / 1000
    return retry_after_seconds(headers.get("Retry-After"))


def error_for_status(provider: str, status: int, body: bytes, headers: Mapping[str, str],
                     secret: str | None) -> GatewayError:
    """The error an upstream status means: the client's fault (relayed) or a failover reason."""
    detail = read_error(body[:MAX_ERROR_BODY])
    message = scrub(detail.message or f"HTTP {status}", secret)
    if status == 429:
        return ProviderRateLimited(message, retry_after=retry_after(headers))
    if status in (401, 403, 404, 407):  # 407: a proxy on the way wants other credentials
        return ProviderRejected(message, upstream_status=status)
    if status == 408:
        return ProviderTimeout(message, upstream_status=status)
    if 400 <= status < 500:
        code = str(detail.code) if detail.code is not None and not isinstance(detail.code, int) \
            else None
        relayed = UpstreamClientError(provider, status, message, error_type=detail.type,
                                      code=code, param=detail.param)
        # Too long for this model, or refused by its policy: another model may answer.
        limit = classify(status, message, detail.type, code)
        if limit is Limit.CONTEXT:
            return ContextLengthExceeded(relayed)
        if limit is Limit.POLICY:
            return ContentRefused(relayed)
        return relayed
    error = ProviderUnavailable(message, upstream_status=status)
    error.retry_after = retry_after(headers)
    return error
