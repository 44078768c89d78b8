"""HTTP/1.1 to one upstream origin: kept-alive connections, one write per request, C parsing.

The relay's upstream calls go through here rather than aiohttp's ClientSession: on the bench
machine a request and its answer over a kept connection cost ~130 µs through the session and
~60 µs through a bare protocol (docs/benchmarks.md), about a third of the gateway's whole CPU
per request. Only what the relay needs is here: a request with its body in one write, answers
by Content-Length, chunked or until close, gzip/deflate if an upstream compresses anyway, TLS,
a per-origin pool (host names looked up through `resolver`), and failures raised as the gateway's
own errors, translated here alone.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import os
import ssl
import time
import zlib
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from providers.contract.errors import (
    BadUpstreamResponse,
    ConnectTimeout,
    Overloaded,
    ProviderUnavailable,
)
from providers.resolver import TTL, HostAddresses, Lookup, system_lookup

# Past this much unread body the socket stops being read: a slow client slows its upstream
# instead of filling the gateway's memory.
HIGH_WATER = 256 * 1024
# Idle connections older than this are closed rather than reused (aiohttp's default is 15 s;
# servers commonly keep 60-75 s, vLLM's uvicorn 5 s, which the stale-connection retry covers).
KEEPALIVE = 60.0
# An answer's head larger than this is refused (aiohttp's limit was 8 KiB a field): an upstream
# gone wrong must not grow the gateway's memory with headers that never end.
MAX_HEAD = 64 * 1024


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL points: its origin (the pool key) and the request line's target."""

    tls: bool
    host: str
    port: int
    path: bytes
    host_header: bytes
    literal: bool  # an IP address: nothing to look up


@functools.lru_cache(maxsize=1024)
def target(url: str) -> Target:
    """Parse an upstream URL once; ValueError if it is not http(s) with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if parts.port is None else f"{shown}:{port}"
    return Target(tls, host, port, path.encode("ascii"), host_header.encode("idna"),
                  _is_ip(host))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def header_block(headers: Mapping[str, str]) -> bytes:
    """Header lines sent with every request; ValueError on a name or value that could split
    the request (CR, LF), since config and environment supply them."""
    lines = []
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"header {name!r} has a forbidden character")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(lines)


@functools.lru_cache(maxsize=1)
def default_tls() -> ssl.SSLContext:
    """The system's trust store, loaded once (it takes milliseconds)."""
    return ssl.create_default_context()


class Response:
    """An answer being read from one connection: status and headers, then the body. Once
    closed it lets go of the connection, which may be carrying another request by then."""

    __slots__ = ("_conn", "headers", "status")

    def __init__(self, conn: Connection, status: int, headers: CIMultiDictProxy[str]) -> None:
        self._conn: Connection | None = conn
        self.status = status
        self.headers = headers

    async def read(self, limit: int | None = None) -> bytes:
        """The body to its end (or its first `limit` bytes)."""
        parts = []
        size = 0
        while chunk := await self.readany():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
        body = b"".join(parts)
        return body if limit is None else body[:limit]

    def readany(self) -> Coroutine[Any, Any, bytes]:
        """What has arrived since the last read, waiting for some if none; b"" at the end."""
        if self._conn is None:
            raise RuntimeError("read from a closed response")
        return self._conn.readany()

    def set_exception(self, exc: BaseException) -> None:
        """Fail the pending (or next) read with `exc`: how stream timeouts fire. A no-op once
        closed (a stream's watchdog can outlive its response by a turn of the loop)."""
        if self._conn is not None:
            self._conn.fail(exc)

    def close(self) -> None:
        """Give the connection back if the answer was read to its end, else close it; once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.release()


class Connection(asyncio.Protocol):
    """One kept-alive connection: writes a request, parses its answer, then waits for reuse."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        # The parser holds this protocol's methods, a cycle: made on connect, dropped when the
        # connection is lost, so a closed connection is freed at once, not by the collector.
        self.parser: httptools.HttpResponseParser | None = None
        self.idle_since = 0.0
        self.reused = False
        self.in_use = True  # from connect or acquire until released
        self._reset()

    def _reset(self) -> None:
        self.header_list: list[tuple[str, str]] = []
        self.head_size = 0
        self.head: asyncio.Future[Response] = self.loop.create_future()
        self.buffer: list[bytes] = []
        self.buffered = 0
        self.waiter: asyncio.Future[bytes] | None = None
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.paused = False
        self.decoder: zlib._Decompress | None = None
        self.until_close = False

    # -- the request side

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def usable(self, now: float) -> bool:
        transport = self.transport
        return (transport is not None and not transport.is_closing()
                and now - self.idle_since < KEEPALIVE)

    def release(self) -> None:
        """Back to the pool when the answer is complete and both sides keep it; else closed."""
        transport = self.transport
        if (transport is None or not self.complete or not self.keep_alive
                or self.error is not None or self.pool.closed or transport.is_closing()):
            self.discard()
            return
        if self.paused:
            transport.resume_reading()
        self._reset()
        self.reused = True
        self.in_use = False
        self.idle_since = now = time.monotonic()
        idle = self.pool.idle
        while idle and not idle[0].usable(now):  # the oldest, unused since long: let go
            idle.popleft().close()
        idle.append(self)

    def discard(self) -> None:
        """Close for good, and forget the answer: a failure raised from it holds frames that
        hold this connection, a cycle that would wait for the collector."""
        self.close()
        self._reset()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    # -- the answer side

    async def readany(self) -> bytes:
        if self.buffer:
            return self._take()
        if self.error is not None:
            raise self.error
        if self.complete:
            return b""
        self.waiter = self.loop.create_future()
        return await self.waiter

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.keep_alive = False
        if not self.head.done():
            self.head.set_exception(exc)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _take(self) -> bytes:
        """Everything buffered, and the socket read again if it was paused for it."""
        data = self.buffer[0] if len(self.buffer) == 1 else b"".join(self.buffer)
        self.buffer = []
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(self._take())

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpResponseParser(self)

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if not self.in_use or parser is None:  # nothing was asked: an upstream out of turn
            self.close()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.error is None:  # else a callback already said what was wrong
                self.fail(BadUpstreamResponse(f"malformed HTTP response: {exc}"))
            self.close()
        except httptools.HttpParserUpgrade:
            self.fail(BadUpstreamResponse("malformed HTTP response: unexpected upgrade"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        closed_by_us = self.transport is None  # close() let go of it first
        self.transport = self.parser = None
        if closed_by_us or not self.in_use or self.complete or self.error is not None:
            return
        if self.until_close and self.head.done():  # a body that ends when the connection does
            self.on_message_complete()
            return
        if self.head.done():
            self.fail(ProviderUnavailable("connection lost while reading the response"))
        else:
            self.fail(_Lost(f"connection lost: {exc or 'server closed the connection'}"))

    # -- httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:  # more after a complete answer: this connection cannot be trusted
            self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value)
        if self.head_size > MAX_HEAD:
            self.fail(BadUpstreamResponse(f"response head larger than {MAX_HEAD} bytes"))
            raise httptools.HttpParserError("head too large")  # stops the parser
        self.header_list.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None  # called by it
        status = parser.get_status_code()
        if 100 <= status < 200:  # informational: the real head follows
            self.header_list = []
            return
        headers = CIMultiDictProxy(CIMultiDict(self.header_list))
        self.keep_alive = parser.should_keep_alive()
        encoding = headers.get("Content-Encoding", "identity").lower()
        if encoding in ("gzip", "deflate", "x-gzip"):
            self.decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header
        elif encoding != "identity":
            self.fail(BadUpstreamResponse(f"unsupported Content-Encoding: {encoding}"))
            return
        self.until_close = ("Content-Length" not in headers
                            and "chunked" not in headers.get("Transfer-Encoding", "").lower())
        if not self.head.done():
            self.head.set_result(Response(self, status, headers))

    def on_body(self, body: bytes) -> None:
        if self.decoder is not None:
            try:
                body = self.decoder.decompress(body)
            except zlib.error as exc:
                self.fail(BadUpstreamResponse(f"bad compressed body: {exc}"))
                self.close()
                return
            if not body:
                return
        self.buffer.append(body)
        self.buffered += len(body)
        if self.waiter is not None:
            self._wake()
        elif self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if not self.head.done():  # an informational answer's end: keep waiting
            return
        if self.decoder is not None and (rest := self.decoder.flush()):
            self.buffer.append(rest)
        self.complete = True
        if self.waiter is not None:
            self._wake()


class _Lost(ProviderUnavailable):
    """The connection went before any answer: on a reused connection, worth one resend."""


class Pool:
    """Kept-alive connections to one origin, reused newest first."""

    def __init__(self, origin: Target, tls: ssl.SSLContext | None, closed: bool = False,
                 addresses: HostAddresses | None = None) -> None:
        self.origin = origin
        self.tls = tls
        self.addresses = addresses  # None: the origin's host is an IP address
        self.loop = asyncio.get_running_loop()
        self.idle: deque[Connection] = deque()  # newest last, taken first
        self.closed = closed  # closed pools keep no connection once its answer is done

    async def acquire(self, connect_timeout: float) -> Connection:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if conn.usable(now):
                conn.in_use = True
                return conn
            conn.close()
        return await self.connect(connect_timeout)

    async def connect(self, connect_timeout: float) -> Connection:
        """A new connection to the origin; failures as the gateway's errors.

        The origin's addresses are tried in order, each with an even share of the time left,
        so one that drops connection attempts (a dead route) leaves time for the next; it then
        goes last for later connections."""
        origin, addresses = self.origin, self.addresses
        deadline = self.loop.time() + connect_timeout
        refused: list[str] = []  # messages, not errors: their tracebacks would hold this frame
        try:
            async with asyncio.timeout_at(deadline):
                hosts = (origin.host,) if addresses is None else await addresses.get()
        except TimeoutError:
            raise ConnectTimeout("connection timed out (resolving the host)") from None
        for tried, host in enumerate(hosts):
            try:
                async with asyncio.timeout((deadline - self.loop.time()) / (len(hosts) - tried)):
                    _, conn = await self.loop.create_connection(
                        lambda: Connection(self), host, origin.port, ssl=self.tls,
                        server_hostname=origin.host if self.tls else None)
                return conn
            except TimeoutError:
                if addresses is not None:
                    addresses.demote(host)
            except ssl.SSLError as exc:
                raise ProviderUnavailable(f"TLS handshake failed: {exc.reason or exc}") from None
            except OSError as exc:  # uvloop's strerror names the address: not shown
                if exc.errno in (errno.EMFILE, errno.ENFILE):  # this process's, not the provider's
                    raise Overloaded("The gateway has no file descriptors left for another "
                                     "upstream connection; retry shortly") from None
                refused.append(os.strerror(exc.errno) if exc.errno else str(exc))
        if addresses is not None:
            addresses.forget()  # they may have moved: look the host up again next time
        if not refused:
            raise ConnectTimeout("connection timed out")
        raise ProviderUnavailable(f"cannot connect: {refused[0]}")

    def close(self) -> None:
        """Close idle connections; those in use close when their answer is done."""
        self.closed = True
        for conn in self.idle:
            conn.close()
        self.idle.clear()


class Client:
    """Requests to any origin, each origin with its pool; one per provider."""

    def __init__(self, tls: ssl.SSLContext | None = None, dns_ttl: float = TTL,
                 lookup: Lookup = system_lookup) -> None:
        self._tls = tls
        self._dns_ttl = dns_ttl
        self._lookup = lookup
        self._pools: dict[tuple[bool, str, int], Pool] = {}
        self.closed = False

    async def request(self, method: bytes, url: str, headers: bytes, body: bytes | None,
                      connect_timeout: float) -> Response:
        """Send a request and return once its answer's head is in (`Response.close()` after).

        A kept connection the upstream closes as idle (uvicorn, under vLLM, after 5 s) can take
        a request in that very moment: when such a reused connection drops before any answer,
        the request goes once more on a new one. Clients usually resend only idempotent
        methods (RFC 9112 9.3.1); an inference POST is safe to send again, as failover does."""
        try:
            where = target(url)
        except ValueError:  # the URL is not in the message: it may carry a key
            raise ProviderUnavailable("the provider's URL is not an http(s) URL") from None
        pool = self._pool(where)
        request = b"".join((method, b" ", where.path, b" HTTP/1.1\r\nHost: ", where.host_header,
                            b"\r\n", headers,
                            b"" if body is None else b"Content-Length: %d\r\n" % len(body),
                            b"\r\n", body or b""))
        conn = await pool.acquire(connect_timeout)
        try:
            return await self._exchange(conn, request)
        except _Lost:
            if not conn.reused:
                raise
        conn = await pool.connect(connect_timeout)
        return await self._exchange(conn, request)

    @staticmethod
    async def _exchange(conn: Connection, request: bytes) -> Response:
        try:
            conn.send(request)
            return await conn.head
        except BaseException:  # cancelled, timed out or failed: this connection is done
            conn.discard()
            raise

    def _pool(self, where: Target) -> Pool:
        key = (where.tls, where.host, where.port)
        pool = self._pools.get(key)
        if pool is None:
            tls = (self._tls or default_tls()) if where.tls else None
            addresses = None if where.literal else HostAddresses(
                where.host, where.port, self._dns_ttl, self._lookup)
            # A late request after close is served; its connection is not kept.
            pool = self._pools[key] = Pool(where, tls, self.closed, addresses)
        return pool

    def close(self) -> None:
        """Close every idle connection; no new ones are kept after this."""
        self.closed = True
        for pool in self._pools.values():
            pool.close()

