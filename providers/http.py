"""HTTP plumbing shared by every provider kind that talks to its upstream over HTTP.

aiohttp's exceptions become `gateway.errors` here and nowhere else (`translate_errors`), an
upstream status becomes a failover decision in `error_for_status`, and upstream error bodies are
cut short and scrubbed of anything that looks like a credential before a client can see them.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Mapping
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import aiohttp
import msgspec

from gateway.config import Timeouts
from gateway.errors import (
    BadUpstreamResponse,
    ConnectTimeout,
    FirstTokenTimeout,
    GatewayError,
    IdleTimeout,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    TotalTimeout,
    UpstreamClientError,
)

MAX_ERROR_MESSAGE = 500
MAX_ERROR_BODY = 64 * 1024

# Looks like a credential: bearer tokens, "sk-..." style keys, key=... query parameters.
_CREDENTIAL = re.compile(
    r"(?i)(bearer\s+)[\w.\-~+/=]{8,}|\b(sk|pk|rk|gsk|xai|key)-[\w\-]{8,}|([?&](?:api_)?key=)[^&\s\"']+"
)


def scrub(text: str, secret: str | None = None) -> str:
    """Cut `text` short and mask credentials, including the provider's own key if given."""
    if secret:
        text = text.replace(secret, "***")
    text = _CREDENTIAL.sub(_mask, text)
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 1] + "…"


def _mask(match: re.Match[str]) -> str:
    prefix = match.group(1) or match.group(3)
    return f"{prefix}***" if prefix else "***"


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
    """Parse a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def error_for_status(provider: str, status: int, body: bytes, headers: Mapping[str, str],
                     secret: str | None) -> GatewayError:
    """The error an upstream status means: the client's fault (relayed) or a failover reason."""
    detail = read_error(body[:MAX_ERROR_BODY])
    message = scrub(detail.message or f"HTTP {status}", secret)
    if status == 429:
        hint = retry_after_seconds(headers.get("Retry-After"))
        return ProviderRateLimited(message, retry_after=hint)
    if status in (401, 403, 404):
        return ProviderRejected(message, upstream_status=status)
    if status == 408:
        return ProviderTimeout(message, upstream_status=status)
    if 400 <= status < 500:
        return UpstreamClientError(
            provider, status, message, error_type=detail.type,
            code=str(detail.code) if detail.code is not None and not isinstance(detail.code, int)
            else None,
            param=detail.param,
        )
    error = ProviderUnavailable(message, upstream_status=status)
    error.retry_after = retry_after_seconds(headers.get("Retry-After"))
    return error


class translate_errors:
    """Turn aiohttp and timeout exceptions raised inside into `ProviderError`s.

    A class rather than a generator-based context manager: it wraps every upstream call, and
    entering and leaving a generator cost about a microsecond each time.
    """

    __slots__ = ("secret",)

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and isinstance(exc, aiohttp.ClientError):
            raise _translated(exc, self.secret) from exc


def _translated(exc: aiohttp.ClientError, secret: str | None) -> GatewayError:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectTimeout("connection timed out")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return IdleTimeout(scrub(str(exc) or "read timed out", secret))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ProviderUnavailable(f"cannot connect: {scrub(str(exc.os_error), secret)}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return ProviderUnavailable("connection lost while reading the response")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
        return ProviderUnavailable(f"connection lost: {scrub(str(exc), secret)}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return BadUpstreamResponse(f"malformed HTTP response: {scrub(exc.message, secret)}")
    return ProviderUnavailable(scrub(str(exc) or type(exc).__name__, secret))


def client_timeout(timeouts: Timeouts, whole: bool = False) -> aiohttp.ClientTimeout:
    """The limits aiohttp enforces: the connect phase, and `total` for a whole answer (its
    timer costs less than an `asyncio.timeout` around the call); a stream's are ours
    (`read_stream`)."""
    return aiohttp.ClientTimeout(total=timeouts.total if whole else None,
                                 connect=timeouts.connect, sock_connect=timeouts.connect,
                                 ceil_threshold=math.inf)  # to the configured time, unrounded


TimeoutKind = type[ProviderTimeout]


class Deadline:
    """The time budget of one exchange: first token and total from its start, idle per gap."""

    __slots__ = ("_loop", "first_token_at", "idle", "total_at")

    def __init__(self, timeouts: Timeouts) -> None:
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self.first_token_at = now + timeouts.first_token
        self.total_at = now + timeouts.total
        self.idle = timeouts.idle

    def first_token(self) -> tuple[float, type[ProviderTimeout]]:
        """Seconds left for headers and the first chunk, and the error that names what fired."""
        return self._until(self.first_token_at, FirstTokenTimeout)

    def next_chunk(self) -> tuple[float, type[ProviderTimeout]]:
        """Seconds allowed for the next chunk."""
        return self._until(self._loop.time() + self.idle, IdleTimeout)

    def capped(self, at: float, error: TimeoutKind) -> tuple[float, TimeoutKind]:
        """A phase's end `at`, unless the total limit comes first (then that, named so)."""
        if self.total_at <= at:
            return self.total_at, TotalTimeout
        return at, error

    def _until(self, at: float, error: TimeoutKind) -> tuple[float, TimeoutKind]:
        at, error = self.capped(at, error)
        return max(0.0, at - self._loop.time()), error


async def read_stream(response: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[bytes]:
    """Yield the body as it arrives, enforcing first-token, idle and total timeouts."""
    reader = response.content
    watchdog = Watchdog(reader, deadline)
    try:
        while chunk := await reader.readany():
            watchdog.got_chunk()
            yield chunk
            watchdog.waiting()
    finally:
        watchdog.stop()


class Watchdog:
    """Fails a stream's pending read with the timeout that names what stalled.

    One timer per stream, re-armed only when it fires: a timeout around each read cost a timer
    and a context manager per chunk, ~10% of the gateway's work per chunk. The idle clock runs
    only while the gateway waits on the upstream, not while the client is slow to take a chunk.
    """

    __slots__ = ("_deadline", "_handle", "_loop", "_reader", "_started", "_waiting_since")

    def __init__(self, reader: aiohttp.StreamReader, deadline: Deadline) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = reader
        self._deadline = deadline
        self._started = False  # no chunk yet: the first-token limit applies
        self._waiting_since: float | None = self._loop.time()
        self._handle = self._loop.call_at(self._due()[0], self._check)

    def got_chunk(self) -> None:
        self._waiting_since = None
        if not self._started:  # from the first-token limit to the idle one: re-arm, once
            self._started = True
            self._handle.cancel()
            self._handle = self._loop.call_at(self._due()[0], self._check)

    def waiting(self) -> None:
        now = self._loop.time()
        self._waiting_since = now
        if now >= self._deadline.total_at:
            self._expire(TotalTimeout)

    def stop(self) -> None:
        self._handle.cancel()

    def _due(self) -> tuple[float, TimeoutKind]:
        deadline = self._deadline
        if not self._started:
            return deadline.capped(deadline.first_token_at, FirstTokenTimeout)
        since = self._loop.time() if self._waiting_since is None else self._waiting_since
        return deadline.capped(since + deadline.idle, IdleTimeout)

    def _check(self) -> None:
        at, error = self._due()
        now = self._loop.time()
        if self._waiting_since is not None and now >= at:
            self._expire(error)
            return
        self._handle = self._loop.call_at(max(at, now + 0.001), self._check)

    def _expire(self, error: TimeoutKind) -> None:
        self._reader.set_exception(error(f"no data within {error.reason.replace('_', ' ')} "
                                         "limit"))


class HttpUpstream:
    """POSTs to one upstream with its headers and timeouts; failures come out as gateway errors."""

    def __init__(self, name: str, session: aiohttp.ClientSession, timeouts: Timeouts,
                 headers: Mapping[str, str], secret: str | None) -> None:
        self.name = name
        self.session = session
        self.timeouts = timeouts
        self.headers = dict(headers)
        self.secret = secret
        self._stream_timeout = client_timeout(timeouts)
        self._whole_timeout = client_timeout(timeouts, whole=True)

    def post(self, url: str, body: bytes) -> Coroutine[Any, Any, tuple[bytes, Mapping[str, str]]]:
        """A whole 2xx answer and its headers, within `total` (to await)."""
        return self._whole("POST", url, body)  # not a coroutine itself: one frame less to resume

    async def get_json(self, url: str) -> Any:
        """A GET answered with JSON (model listings), within `total`."""
        payload, _ = await self._whole("GET", url, None)
        try:
            return msgspec.json.decode(payload)
        except msgspec.DecodeError as exc:
            raise BadUpstreamResponse(f"listing is not JSON: {exc}") from None

    async def _whole(self, method: str, url: str, body: bytes | None
                     ) -> tuple[bytes, Mapping[str, str]]:
        try:
            with translate_errors(self.secret):
                async with await self._request(method, url, body,
                                               self._whole_timeout) as response:
                    payload = await response.read()
                    status, headers = response.status, response.headers
        except TimeoutError:  # aiohttp's total timer; its connect timeout was translated above
            raise TotalTimeout(f"no complete answer within {self.timeouts.total:g}s") from None
        if not 200 <= status < 300:
            raise error_for_status(self.name, status, payload, headers, self.secret)
        return payload, headers

    async def stream(self, url: str, body: bytes) -> AsyncGenerator[bytes, None]:
        """The body of a 2xx streamed answer as it arrives, within all four timeouts."""
        deadline = Deadline(self.timeouts)
        with translate_errors(self.secret):
            limit, error = deadline.first_token()
            try:
                async with asyncio.timeout(limit):
                    response = await self._request("POST", url, body, self._stream_timeout)
            except TimeoutError:
                raise error(f"no response headers within {limit:g}s") from None
            try:
                if response.status != 200:
                    await self._raise_for_status(response, deadline)
                if response.headers.get("Content-Type", "").startswith("application/json"):
                    raise BadUpstreamResponse("answered JSON to a streaming request")
                async for chunk in read_stream(response, deadline):
                    yield chunk
            finally:
                response.close()

    async def _request(self, method: str, url: str, body: bytes | None,
                       limits: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """The response, once its head is in; sent once more when the connection dropped
        before any answer. A kept-alive connection the upstream closes as idle (uvicorn, under
        vLLM, after 5 s) can take a request in that very moment, and the client would get an
        error for a request the upstream never read. aiohttp resends only idempotent methods
        (RFC 9112 9.3.1); an inference POST is safe to send again, as failover does anyway."""
        try:
            return await self.session.request(method, url, data=body, headers=self.headers,
                                              timeout=limits)
        except aiohttp.ClientConnectorError:
            raise  # never connected: nothing to retry here, failover decides
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return await self.session.request(method, url, data=body, headers=self.headers,
                                              timeout=limits)

    async def _raise_for_status(self, response: aiohttp.ClientResponse,
                                deadline: Deadline) -> None:
        limit, _ = deadline.next_chunk()
        try:
            async with asyncio.timeout(limit):
                body = await response.content.read(MAX_ERROR_BODY)
        except (TimeoutError, aiohttp.ClientError):
            body = b""
        raise error_for_status(self.name, response.status, body, response.headers, self.secret)
