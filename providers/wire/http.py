"""HTTP plumbing shared by every provider kind that talks to its upstream over HTTP.

The transport (`contract.transport`) carries the bytes and raises the gateway's own errors; here
a request is sent with the upstream's headers and `Link`, its answer read within the four
timeouts (`wire.deadline`), and a status that is not a success raised as what it means
(`wire.upstream_errors`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Coroutine, Mapping
from typing import Any

import msgspec

from providers.contract.errors import (
    AnsweredWhole,
    BadUpstreamResponse,
    FirstTokenTimeout,
    ProviderError,
    ProviderTimeout,
    TotalTimeout,
)
from providers.contract.spec import Timeouts
from providers.contract.translate import Translator
from providers.contract.transport import DIRECT, HttpResponse, Link, Transport
from providers.wire.deadline import DATA, EVERY_CHUNK, Deadline, Watchdog, read_stream
from providers.wire.expiry import Expiries
from providers.wire.upstream_errors import MAX_ERROR_BODY, error_for_status


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
        self._expiries = Expiries(timeouts.total)  # whole answers' totals, one timer for all

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
        expiry = self._expiries.start()
        try:
            response = await self._transport.request(
                method, url, headers={**self._headers, **extra} if extra else self._headers,
                body=body, link=self._link, connect_timeout=self.timeouts.connect)
            try:
                payload = await response.read()
            finally:
                response.close()
        except asyncio.CancelledError:
            if not expiry.lapsed():
                raise
            raise TotalTimeout(f"no complete answer within {self.timeouts.total:g}s") from None
        finally:
            self._expiries.end(expiry)
        if not 200 <= response.status < 300:
            raise error_for_status(self.name, response.status, payload, response.headers,
                                   self.secret)
        return payload, response.headers

    async def stream(self, url: str, body: bytes, extra: Mapping[str, str] | None = None,
                     progress: bytes = DATA, translator: Translator | None = None
                     ) -> AsyncGenerator[bytes, None]:
        """The body of a 2xx streamed answer as it arrives, within all four timeouts; `extra`
        headers go with this request only; `progress` marks a data event in its framing; with
        a `translator`, what it makes of the body (`contract.translate.translated`'s loop)."""
        deadline = Deadline(self.timeouts)
        # Its one timer keeps the first-token limit from the request on: on the head, then on
        # the body's first data event (`_opened`'s `asyncio.timeout` would be a second).
        watchdog = Watchdog(None, deadline, progress)
        try:
            try:
                response = await self._transport.request(
                    "POST", url,
                    headers={**self._headers, **extra} if extra else self._headers, body=body,
                    link=self._link, connect_timeout=self.timeouts.connect, compressed=False)
            except asyncio.CancelledError:
                if not watchdog.lapsed():
                    raise
                limit, error = self._head_limit()
                raise error(f"no response headers within {limit:g}s") from None
            watchdog.opened(response)
            try:
                if response.status != 200:
                    watchdog.stop()
                    await self._raise_for_status(response, deadline)
                if response.headers.get("Content-Type", "").startswith("application/json"):
                    watchdog.stop()
                    limit, error = deadline.next_chunk()
                    try:
                        async with asyncio.timeout(limit):
                            payload = await response.read()
                    except TimeoutError:
                        raise error(f"no complete answer within {limit:g}s") from None
                    raise AnsweredWhole(payload)
                # `read_stream`'s loop, and `translated`'s, written here: one generator, not
                # three, to pass each chunk on.
                if translator is None:
                    while chunk := await response.readany():
                        watchdog.got_chunk(chunk)
                        yield chunk
                        watchdog.waiting()
                else:
                    while chunk := await response.readany():
                        watchdog.got_chunk(chunk)
                        if out := translator.feed(chunk):
                            yield out
                        watchdog.waiting()
            finally:
                response.close()
        finally:
            watchdog.stop()
        if translator is not None and (tail := translator.close()):
            yield tail

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

    def _head_limit(self) -> tuple[float, type[ProviderTimeout]]:
        """The first-token limit on an answer's head as `Deadline.first_token` gives it at
        the start (the total's, named so, when that is shorter)."""
        timeouts = self.timeouts
        if timeouts.total <= timeouts.first_token:
            return timeouts.total, TotalTimeout
        return timeouts.first_token, FirstTokenTimeout

    async def _raise_for_status(self, response: HttpResponse, deadline: Deadline) -> None:
        limit, _ = deadline.next_chunk()
        try:
            async with asyncio.timeout(limit):
                body = await response.read(MAX_ERROR_BODY)
        except (TimeoutError, ProviderError):
            body = b""
        raise error_for_status(self.name, response.status, body, response.headers, self.secret)
