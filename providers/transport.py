"""The shipped `Transport`: one aiohttp `ClientSession` for the whole process.

The session's settings, and why each:

    TCPConnector(limit=0)        no cap of the library's own: `server.max_concurrency` bounds
                                 requests, and a second, hidden queue would turn a burst into
                                 connect timeouts blamed on the provider
    keepalive_timeout=60         idle connections kept a minute: servers commonly keep 60-75 s
                                 (uvicorn under vLLM 5 s: the stale-connection resend covers it)
    ttl_dns_cache=60             a burst of new connections looks a host up once; a minute still
                                 follows a provider that moves its addresses
    happy eyeballs (default)     IPv6 and IPv4 addresses raced 250 ms apart, so a dead route to
                                 one family costs no connect timeout
    DummyCookieJar               one session serves every client: a cookie one upstream answer
                                 sets must never ride along on another client's request
    trust_env=False              proxies are resolved per provider (`Link`, from llms.json or the
                                 environment, with NO_PROXY) before a request gets here
    no session ClientTimeout     a stream lasts as long as its provider's `total` allows; only
                                 `connect` is set here, per request; `providers.wire.http` owns the
                                 first-token, idle and total limits
    auto_decompress=True         gzip, deflate (zlib and raw) and br are decoded by aiohttp, which
                                 inflates at most `read_bufsize` per step and stops reading the
                                 socket while that much is unread: a bomb inflates no faster
                                 than it is read, and `read()` stops at `max_answer_bytes`
    allow_redirects=False        an API that redirects is misconfigured; following would resend
                                 the body, and maybe the key, somewhere else
    max_line_size/field_size     aiohttp's 8190-byte limits per header line, 128 headers at most

Library errors become the gateway's (`contract.errors`) in `map_aiohttp_exceptions` alone.
"""

from __future__ import annotations

import errno
import os
import ssl
from collections.abc import Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any, Literal

import aiohttp
from aiohttp.http_exceptions import ContentEncodingError
from yarl import URL

from providers.contract.errors import (
    BadUpstreamResponse,
    ConnectTimeout,
    GatewayError,
    Overloaded,
    ProviderRejected,
    ProviderUnavailable,
)
from providers.contract.log import get_logger
from providers.contract.transport import DIRECT, Link, TlsOptions, Transport
from providers.websocket import AiohttpSocket, open_socket

KEEPALIVE = 60.0
DNS_TTL = 60
# No total, read or pool limit: `providers.wire.http` times each phase itself.
_NO_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None)
_IDENTITY = "identity"


class _ErrorMap:
    """Translates what aiohttp (or the OS under it) raises into the gateway's errors.

    One instance per kind of route, reused: entering it costs no allocation, so it wraps every
    read of a stream. Messages are written here, never copied from the library's: those name
    hosts, ports and, for a proxy, the URL with its credentials."""

    __slots__ = ("via_proxy",)

    def __init__(self, via_proxy: bool) -> None:
        self.via_proxy = via_proxy

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if exc is None or isinstance(exc, GatewayError):
            return False
        if isinstance(exc, aiohttp.ClientError) or (
                isinstance(exc, OSError) and not isinstance(exc, TimeoutError)):
            _drop_tracebacks(exc)
            # Raised, never bound to a local: this frame is in its traceback.
            raise _translate(exc, self.via_proxy) from None
        return False  # cancellation, a caller's own timeout, a bug: not ours to rename


def _drop_tracebacks(exc: BaseException | None) -> None:
    """Let go of the frames a dropped library error holds. aiohttp keeps a failed body's error
    on its reader and raises it from there, so error, traceback, frame and reader form a cycle
    (the connection's parser too): left alone, every failed answer would wait for the cyclic
    collector, whose pauses grow with what it finds."""
    for _ in range(8):  # the chain is short: the error, what caused it, what that replaced
        if exc is None:
            return
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


_DIRECT_ERRORS = _ErrorMap(via_proxy=False)
_PROXY_ERRORS = _ErrorMap(via_proxy=True)


def map_aiohttp_exceptions(via_proxy: bool = False) -> _ErrorMap:
    """The context manager that turns aiohttp's exceptions into `contract.errors` ones,
    re-raised `from None` so no library message (with a proxy's credentials) rides along."""
    return _PROXY_ERRORS if via_proxy else _DIRECT_ERRORS


def _translate(exc: BaseException, via_proxy: bool) -> GatewayError:
    if isinstance(exc, aiohttp.ClientConnectorError):  # DNS, refused, TLS, proxy unreachable
        return _connect_failure(exc, via_proxy)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return ConnectTimeout("connecting through the proxy timed out" if via_proxy
                              else "connection timed out")
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return _tunnel_refused(exc.status)
    if isinstance(exc, aiohttp.ClientPayloadError):
        if isinstance(exc.__cause__, ContentEncodingError):
            return BadUpstreamResponse("bad compressed body: it does not decode as its "
                                       "Content-Encoding says")
        return ProviderUnavailable("connection lost while reading the response")
    if isinstance(exc, aiohttp.ClientResponseError):  # a head aiohttp's parser refused
        return BadUpstreamResponse(f"malformed HTTP response ({_cause_name(exc)})")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return ProviderUnavailable("connection lost: the server closed it without answering")
    if isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return ProviderUnavailable("the provider's URL is not a valid http(s) URL")
    if isinstance(exc, OSError):  # ClientOSError, a reset, or the OS's own
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return _no_descriptors()
        return ProviderUnavailable(f"connection lost: {_strerror(exc)}")
    return ProviderUnavailable(f"upstream request failed ({type(exc).__name__})")


def _connect_failure(exc: aiohttp.ClientConnectorError, via_proxy: bool) -> GatewayError:
    os_error = exc.os_error
    if os_error.errno in (errno.EMFILE, errno.ENFILE):
        return _no_descriptors()
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        problem = exc.certificate_error
        reason = getattr(problem, "reason", None) or type(problem).__name__
        detail = getattr(problem, "verify_message", None)
        return ProviderUnavailable(f"TLS handshake failed: {reason}"
                                   + (f" ({detail})" if detail else ""))
    if isinstance(exc, aiohttp.ClientSSLError):
        return ProviderUnavailable("TLS handshake failed: "
                                   + (getattr(os_error, "reason", None) or _strerror(os_error)))
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        # Through a proxy only the proxy's name is looked up here: the proxy resolves the rest.
        whose = "the proxy's" if via_proxy else "the provider's"
        return ProviderUnavailable(f"cannot resolve {whose} host name")
    if isinstance(exc, aiohttp.ClientProxyConnectionError):
        return ProviderUnavailable(f"cannot connect to the proxy: {_strerror(os_error)}")
    return ProviderUnavailable(f"cannot connect: {_strerror(os_error)}")


def _tunnel_refused(status: int) -> GatewayError:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    message = f"the proxy refused the connection: {status} {phrase}".rstrip()
    if status == 407:  # the proxy's credentials: this provider's config, not worth a retry
        return ProviderRejected(message, upstream_status=status)
    return ProviderUnavailable(message, upstream_status=status)


def _no_descriptors() -> Overloaded:
    # This process's limit, not the provider's failure: 503 with Retry-After, no breaker trip.
    return Overloaded("The gateway has no file descriptors left for another upstream "
                      "connection; retry shortly")


def _strerror(exc: OSError) -> str:
    # os.strerror, not the exception's own text: uvloop's and aiohttp's name the address.
    if exc.errno:
        return os.strerror(exc.errno)
    return exc.strerror or str(exc) or type(exc).__name__


def _cause_name(exc: BaseException) -> str:
    """The innermost cause's class (`LineTooLong`, `BadStatusLine`): what went wrong, without
    the upstream's bytes that aiohttp quotes in its message."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return type(exc).__name__


# Errors that mean a kept-alive connection was already gone when the request went out on it.
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
          aiohttp.ClientConnectionResetError)


class _Route:
    """What one `Link` becomes for aiohttp, built once: the proxy URL, the SSL context, the
    error map and the answer cap."""

    __slots__ = ("errors", "max_answer_bytes", "proxy", "ssl")

    def __init__(self, link: Link, ssl_context: ssl.SSLContext | bool) -> None:
        # aiohttp reads the proxy's credentials from its URL (Proxy-Authorization, sent to the
        # proxy alone). Its own messages may quote that URL: none of them leaves this module.
        self.proxy = URL(link.proxy) if link.proxy else None
        self.ssl = ssl_context
        self.errors = map_aiohttp_exceptions(via_proxy=self.proxy is not None)
        self.max_answer_bytes = link.max_answer_bytes


def tls_context(tls: TlsOptions) -> ssl.SSLContext:
    """The SSL context for a provider's `"tls"` options; ValueError naming the field whose file
    cannot be used. A `ca_file` replaces the system's trust store, as curl's --cacert does."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"tls.ca_file: cannot load {tls.ca_file}: {_tls_reason(exc)}") from None
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.cert_file:
        try:
            # A key with a passphrase fails here rather than prompting on the terminal.
            context.load_cert_chain(tls.cert_file, tls.key_file, password=lambda: b"")
        except (OSError, ssl.SSLError) as exc:
            field = "tls.key_file" if tls.key_file and isinstance(exc, ssl.SSLError) \
                else "tls.cert_file"
            raise ValueError(f"{field}: cannot load the client certificate: "
                             f"{_tls_reason(exc)}") from None
    context.set_alpn_protocols(["http/1.1"])
    return context


def _tls_reason(exc: OSError) -> str:
    return getattr(exc, "reason", None) or exc.strerror or str(exc)


class AiohttpTransport(Transport):
    """Every upstream request of the process, over one aiohttp session (build it inside the
    running event loop; close it when done)."""

    def __init__(self, *, keepalive: float = KEEPALIVE, dns_ttl: int = DNS_TTL) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive,
                                         ttl_dns_cache=dns_ttl)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
            timeout=_NO_TIMEOUT, auto_decompress=True, raise_for_status=False)
        self._routes: dict[Link, _Route] = {}
        self._contexts: dict[TlsOptions, ssl.SSLContext] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._warned: set[str] = set()

    def prepare(self, link: Link, provider: str) -> None:
        """Build `link`'s route now (TLS files loaded once); warn once per provider that does
        not verify its upstream's certificate."""
        self._route(link)
        if link.tls is not None and not link.tls.verify and provider not in self._warned:
            self._warned.add(provider)
            get_logger().warning("tls_verification_disabled", provider=provider,
                                 detail="tls.verify is false: this provider's certificate is "
                                        "not checked, so anyone on the path can read its traffic")

    def _route(self, link: Link) -> _Route:
        route = self._routes.get(link)
        if route is None:
            context: ssl.SSLContext | bool = True  # aiohttp's default, verified context
            if link.tls is not None:
                context = self._contexts.get(link.tls) or tls_context(link.tls)
                self._contexts[link.tls] = context
            route = self._routes[link] = _Route(link, context)
        return route

    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      body: bytes | None = None, link: Link = DIRECT,
                      connect_timeout: float = 10.0, compressed: bool = True) -> _Answer:
        """Send one request; the answer once its head is in (see `Transport.request`)."""
        route = self._routes.get(link) or self._checked_route(link)
        if not compressed and not any(name.lower() == "accept-encoding" for name in headers):
            # A compressing server may hold events back to fill its buffer; a header the
            # config sets wins.
            headers = {**headers, "Accept-Encoding": _IDENTITY}
        timeout = self._timeouts.get(connect_timeout)
        if timeout is None:
            timeout = self._timeouts[connect_timeout] = aiohttp.ClientTimeout(
                total=None, connect=connect_timeout)
        with route.errors:
            try:
                response = await self._send(method, url, headers, body, route, timeout)
            except _STALE as exc:
                if isinstance(exc, aiohttp.ClientConnectorError):
                    raise  # no connection was made: nothing stale, fail over at once
                # A kept connection the upstream closed as idle just as this request went out
                # on it (uvicorn under vLLM closes after 5 s). aiohttp resends only idempotent
                # methods; an inference POST is as safe to send again as failover makes it.
                _drop_tracebacks(exc)
                response = await self._send(method, url, headers, body, route, timeout)
        return _Answer(response, route)

    def _checked_route(self, link: Link) -> _Route:
        try:
            return self._route(link)
        except ValueError as exc:  # prepare() was skipped: say what is wrong with the link
            raise ProviderUnavailable(str(exc)) from None

    async def websocket(self, url: str, *, headers: Mapping[str, str], link: Link = DIRECT,
                        connect_timeout: float = 10.0, max_frame_bytes: int = 4 << 20
                        ) -> AiohttpSocket:
        """Open a WebSocket on the session (see `Transport.websocket`)."""
        route = self._routes.get(link) or self._checked_route(link)
        return await open_socket(self._session, url, headers, proxy=route.proxy,
                                 ssl_context=route.ssl, errors=route.errors,
                                 connect_timeout=connect_timeout,
                                 max_frame_bytes=max_frame_bytes)

    def _send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
              route: _Route, timeout: aiohttp.ClientTimeout) -> Any:
        return self._session.request(method, url, headers=headers, data=body, proxy=route.proxy,
                                     ssl=route.ssl, timeout=timeout, allow_redirects=False)

    async def close(self) -> None:
        """Close the session and every connection it keeps."""
        await self._session.close()


class _Answer:
    """An aiohttp answer as the contract's `HttpResponse`: reads counted and their errors
    translated."""

    __slots__ = ("_content", "_errors", "_max", "_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse, route: _Route) -> None:
        self._response = response
        self._content = response.content
        self._errors = route.errors
        self._max = route.max_answer_bytes
        self.status = response.status
        self.headers = response.headers

    async def read(self, limit: int | None = None) -> bytes:
        """The body, decompressed, up to `max_answer_bytes` (else BadUpstreamResponse, having
        held no more than that); with `limit`, its first `limit` bytes."""
        most = self._max
        declared = self._response.content_length
        if (limit is None and declared is not None and declared > most
                and "Content-Encoding" not in self.headers):
            raise BadUpstreamResponse(f"answer of {declared} bytes is larger than "
                                      f"max_answer_bytes ({most})")
        parts: list[bytes] = []
        size = 0
        content = self._content
        with self._errors:
            while chunk := await content.readany():
                parts.append(chunk)
                size += len(chunk)
                if limit is not None and size >= limit:
                    return b"".join(parts)[:limit]
                if size > most:
                    parts.clear()
                    raise BadUpstreamResponse(f"answer larger than max_answer_bytes ({most}) "
                                              "once decompressed" if "Content-Encoding" in
                                              self.headers else
                                              f"answer larger than max_answer_bytes ({most})")
        return b"".join(parts)

    async def readany(self) -> bytes:
        """The next chunk as it arrives; b"" at the end."""
        with self._errors:
            return await self._content.readany()

    def set_exception(self, exc: BaseException) -> None:
        """Fail the pending and later reads with `exc`."""
        self._content.set_exception(exc)

    def close(self) -> None:
        """Back to the pool when the body was read to its end, else the connection closes."""
        self._response.release()
