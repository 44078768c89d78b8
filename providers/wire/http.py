"""HTTP plumbing shared by every provider kind that talks to its upstream over HTTP.

The transport (`contract.transport`) carries the bytes and raises the gateway's own errors; here
an upstream status becomes a failover decision (`error_for_status`), the four timeouts are
enforced, and upstream error bodies are cut short and scrubbed of anything that looks like a
credential before a client can see them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import msgspec

from providers.contract.errors import (
    AnsweredWhole,
    BadUpstreamResponse,
    ContentRefused,
    ContextLengthExceeded,
    FirstTokenTimeout,
    GatewayError,
    IdleTimeout,
    ProviderError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    TotalTimeout,
    UpstreamClientError,
)
from providers.contract.redact import mask_credentials
from providers.contract.refusals import Limit, classify
from providers.contract.spec import Timeouts
from providers.contract.transport import DIRECT, HttpResponse, Link, Transport

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


TimeoutKind = type[ProviderTimeout]
DATA = b"data:"  # what starts a server-sent event's data: progress in an SSE stream
EVERY_CHUNK = b""  # a binary answer's mark (audio): every chunk is progress


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


class Body(Protocol):
    """A body read as it arrives (`HttpResponse`): what the stream timeouts act on."""

    def readany(self) -> Awaitable[bytes]: ...

    def set_exception(self, exc: BaseException) -> None: ...


async def read_stream(response: Body, deadline: Deadline, progress: bytes = DATA
                      ) -> AsyncIterator[bytes]:
    """Yield the body as it arrives, enforcing first-token, idle and total timeouts; a chunk
    with `progress` in it is progress."""
    watchdog = Watchdog(response, deadline, progress)
    try:
        while chunk := await response.readany():
            watchdog.got_chunk(chunk)
            yield chunk
            watchdog.waiting()
    finally:
        watchdog.stop()


class Watchdog:
    """Fails a stream's pending read with the timeout that names what stalled.

    Only data events count as progress: an SSE comment (`: ping`) or a line trickled a byte at
    a time proves nothing, so neither stops the first-token clock nor restarts the idle one.
    One timer per stream, re-armed only when it fires: a timeout around each read cost a timer
    and a context manager per chunk, ~10% of the gateway's work per chunk. The idle clock runs
    only while the gateway waits on the upstream, not while the client is slow to take a chunk.
    """

    __slots__ = ("_deadline", "_handle", "_idle_from", "_loop", "_progress", "_reader",
                 "_started", "_tail", "_waiting")

    def __init__(self, reader: Body, deadline: Deadline, progress: bytes = DATA) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = reader
        self._deadline = deadline
        self._started = False  # no data event yet: the first-token limit applies
        self._waiting = True
        self._idle_from: float | None = None  # since the last data event, once waiting again
        self._progress = progress  # the mark of a data event (another framing has its own)
        self._tail = b""  # the end of the last chunk: the mark may straddle two
        self._handle = self._loop.call_at(self._due()[0], self._check)

    def got_chunk(self, chunk: bytes) -> None:
        self._waiting = False
        seen = self._tail + chunk if self._tail else chunk
        self._tail = chunk[1 - len(self._progress):]
        if self._progress not in seen:
            return
        self._idle_from = None
        if not self._started:  # from the first-token limit to the idle one: re-arm, once
            self._started = True
            self._handle.cancel()
            self._handle = self._loop.call_at(self._due()[0], self._check)

    def waiting(self) -> None:
        now = self._loop.time()
        self._waiting = True
        if self._idle_from is None:
            self._idle_from = now
        if now >= self._deadline.total_at:
            self._expire(TotalTimeout)

    def stop(self) -> None:
        self._handle.cancel()

    def _due(self) -> tuple[float, TimeoutKind]:
        deadline = self._deadline
        if not self._started:
            return deadline.capped(deadline.first_token_at, FirstTokenTimeout)
        since = self._loop.time() if self._idle_from is None else self._idle_from
        return deadline.capped(since + deadline.idle, IdleTimeout)

    def _check(self) -> None:
        at, error = self._due()
        now = self._loop.time()
        if self._waiting and now >= at:
            self._expire(error)
            return
        self._handle = self._loop.call_at(max(at, now + 0.001), self._check)

    def _expire(self, error: TimeoutKind) -> None:
        self._reader.set_exception(error(f"no data within {error.reason.replace('_', ' ')} "
                                         "limit"))


def check_headers(headers: Mapping[str, str]) -> None:
    """ValueError (a config error) on a header name or value that could split the request:
    config and environment supply them."""
    for name, value in headers.items():
        if not name or ":" in name or any(c in name + value for c in "\r\n\0"):
            raise ValueError(f"header {name!r} has a forbidden character")


class HttpUpstream:
    """Requests to one upstream with its headers, timeouts and `Link`, through the process's
    transport; failures come out as gateway errors."""

    def __init__(self, name: str, timeouts: Timeouts, headers: Mapping[str, str],
                 secret: str | None, transport: Transport, link: Link = DIRECT) -> None:
        self.name = name
        self.timeouts = timeouts
        self.secret = secret
        check_headers(headers)
        transport.prepare(link, name)  # ValueError (a config error) on unusable TLS files
        self._transport = transport
        self._link = link
        # Built once, not per request. Whole answers may come compressed (the transport decodes
        # them); streams ask for none (`compressed=False`).
        self._headers = dict(headers)

    def credentials(self) -> Mapping[str, str]:
        """The headers every request carries but its body type: credentials, configured
        headers (what `/passthrough` sends with a client's request)."""
        return {name: value for name, value in self._headers.items()
                if name.lower() != "content-type"}

    def post(self, url: str, body: bytes, extra: Mapping[str, str] | None = None
             ) -> Coroutine[Any, Any, tuple[bytes, Mapping[str, str]]]:
        """A whole 2xx answer and its headers, within `total` (to await); `extra` headers
        go with this request only."""
        return self._whole("POST", url, body, extra)  # not a coroutine: one frame less to resume

    def call(self, method: str, url: str, body: bytes | None,
             extra: Mapping[str, str] | None = None
             ) -> Coroutine[Any, Any, tuple[bytes, Mapping[str, str]]]:
        """A whole 2xx answer to any method (an upstream's files and batches), within
        `total`."""
        return self._whole(method, url, body, extra)

    async def get_json(self, url: str) -> Any:
        """A GET answered with JSON (model listings), within `total`."""
        payload, _ = await self._whole("GET", url, None)
        try:
            return msgspec.json.decode(payload)
        except msgspec.DecodeError as exc:
            raise BadUpstreamResponse(f"listing is not JSON: {exc}") from None

    async def _whole(self, method: str, url: str, body: bytes | None,
                     extra: Mapping[str, str] | None = None) -> tuple[bytes, Mapping[str, str]]:
        try:
            async with asyncio.timeout(self.timeouts.total):
                response = await self._transport.request(
                    method, url, headers={**self._headers, **extra} if extra else self._headers,
                    body=body, link=self._link,
                    connect_timeout=self.timeouts.connect)
                try:
                    payload = await response.read()
                finally:
                    response.close()
        except TimeoutError:
            raise TotalTimeout(f"no complete answer within {self.timeouts.total:g}s") from None
        if not 200 <= response.status < 300:
            raise error_for_status(self.name, response.status, payload, response.headers,
                                   self.secret)
        return payload, response.headers

    async def stream(self, url: str, body: bytes, extra: Mapping[str, str] | None = None,
                     progress: bytes = DATA) -> AsyncGenerator[bytes, None]:
        """The body of a 2xx streamed answer as it arrives, within all four timeouts; `extra`
        headers go with this request only; `progress` marks a data event in its framing."""
        deadline = Deadline(self.timeouts)
        response = await self._opened(url, body, extra, deadline)
        try:
            if response.status != 200:
                await self._raise_for_status(response, deadline)
            if response.headers.get("Content-Type", "").startswith("application/json"):
                limit, error = deadline.next_chunk()
                try:
                    async with asyncio.timeout(limit):
                        payload = await response.read()
                except TimeoutError:
                    raise error(f"no complete answer within {limit:g}s") from None
                raise AnsweredWhole(payload)
            async for chunk in read_stream(response, deadline, progress):
                yield chunk
        finally:
            response.close()

    async def flow(self, url: str, body: bytes, extra: Mapping[str, str] | None = None
                   ) -> tuple[Mapping[str, str], AsyncGenerator[bytes, None]]:
        """A 2xx answer's headers, and its body (bytes of any kind: audio) as it arrives,
        within all four timeouts and `max_answer_bytes`."""
        deadline = Deadline(self.timeouts)
        response = await self._opened(url, body, extra, deadline)
        if not 200 <= response.status < 300:
            try:
                await self._raise_for_status(response, deadline)
            finally:
                response.close()
        return response.headers, self._bounded(response, deadline)

    async def _opened(self, url: str, body: bytes, extra: Mapping[str, str] | None,
                      deadline: Deadline) -> HttpResponse:
        """A POST whose answer's head came within the first token's time; its body unread and
        uncompressed (it is relayed as it comes)."""
        limit, error = deadline.first_token()
        try:
            async with asyncio.timeout(limit):
                return await self._transport.request(
                    "POST", url, headers={**self._headers, **extra} if extra else self._headers,
                    body=body, link=self._link,
                    connect_timeout=self.timeouts.connect, compressed=False)
        except TimeoutError:
            raise error(f"no response headers within {limit:g}s") from None

    async def _bounded(self, response: HttpResponse, deadline: Deadline
                       ) -> AsyncGenerator[bytes, None]:
        most, size = self._link.max_answer_bytes, 0
        try:
            async for chunk in read_stream(response, deadline, EVERY_CHUNK):
                size += len(chunk)
                if size > most:
                    raise BadUpstreamResponse(f"answer larger than max_answer_bytes ({most})")
                yield chunk
        finally:
            response.close()

    async def _raise_for_status(self, response: HttpResponse, deadline: Deadline) -> None:
        limit, _ = deadline.next_chunk()
        try:
            async with asyncio.timeout(limit):
                body = await response.read(MAX_ERROR_BODY)
        except (TimeoutError, ProviderError):
            body = b""
        raise error_for_status(self.name, response.status, body, response.headers, self.secret)
