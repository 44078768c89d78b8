"""The one interface every upstream HTTP call goes through: relay, pool health, discovery, CLI.

A kind sends a request through its `Transport` and reads the `HttpResponse` it gets back; which
library carries the bytes is the implementation's business (`providers.transport`, aiohttp), and
the library's exceptions are translated into the error tree (`errors`) there, in one place:

    connect refused / reset / DNS failure      ProviderUnavailable
    no connection within `connect_timeout`     ConnectTimeout
    no file descriptor left                    Overloaded (the gateway's limit, not the provider's)
    malformed answer, bad or oversized body    BadUpstreamResponse
    TLS verification failure                   ProviderUnavailable (names the certificate problem)
    the proxy refused or failed the tunnel     ProviderUnavailable (407: ProviderRejected)

How one upstream is reached (its proxy, its TLS options, how big an answer may be) is a `Link`,
resolved once per provider from its spec (`ProviderSpec.link_for`). Proxies follow curl and
requests: `"proxy"` in llms.json when given, else the environment's `HTTPS_PROXY`, `HTTP_PROXY`,
`ALL_PROXY` and `NO_PROXY` (`ProxyEnvironment`, read once with the config).
"""

from __future__ import annotations

import ipaddress
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self
from urllib.parse import urlsplit

import msgspec

# The largest whole answer (also after decompression) unless llms.json says otherwise.
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024 * 1024

PROXY_SCHEMES = ("http", "https")  # what the transport can speak to a proxy (no SOCKS)


# Structs, frozen: a `Link` is hashed for every request (the transport's routes are keyed by
# it), and a frozen dataclass hashes in Python.
class TlsOptions(msgspec.Struct, frozen=True):
    """A provider's `"tls"` in llms.json: a private CA, a client certificate, or no checks."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


class Link(msgspec.Struct, frozen=True):
    """How to reach one upstream: through which proxy (None: directly), with which TLS options,
    and how many bytes a whole answer may take. Its repr hides the proxy's credentials."""

    proxy: str | None = None
    tls: TlsOptions | None = None
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES

    def __repr__(self) -> str:
        proxy = None if self.proxy is None else hide_credentials(self.proxy)
        return f"Link(proxy={proxy!r}, tls={self.tls!r}, max_answer_bytes={self.max_answer_bytes})"


DIRECT = Link()


def hide_credentials(url: str) -> str:
    """`url` with any `user:password@` replaced by `***@`, for logs, errors and reprs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"


def check_proxy(url: str, field: str) -> str:
    """A proxy URL the transport can use, `http://` added when no scheme is given (as curl does);
    ValueError naming `field` (never the credentials) otherwise."""
    if "://" not in url:
        url = "http://" + url
    scheme = url.partition("://")[0].lower()
    if scheme not in PROXY_SCHEMES:
        raise ValueError(f"{field}: a {scheme}:// proxy is not supported (http:// or https://; "
                         "SOCKS needs a local HTTP bridge)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        raise ValueError(f"{field}: not a proxy URL: {hide_credentials(url)}") from None
    if not parts.hostname:
        raise ValueError(f"{field}: the proxy URL has no host: {hide_credentials(url)}")
    return url


@dataclass(frozen=True, slots=True, repr=False)
class ProxyEnvironment:
    """The environment's proxy variables, read once (`read`), as curl and requests use them:
    `https_proxy` for https URLs, `http_proxy` for http ones, `all_proxy` for either, lowercase
    names before uppercase ones, and `no_proxy` (host suffixes, `*`, or address ranges) to go
    direct. Its repr hides credentials."""

    # (scheme, proxy URL, the variable it came from); scheme "no" holds NO_PROXY's list.
    entries: tuple[tuple[str, str, str], ...] = ()

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> ProxyEnvironment:
        """The proxy settings in `environ` (os.environ, or a test's own mapping)."""
        found: dict[str, tuple[str, str]] = {}
        for scheme in ("http", "https", "all", "no"):
            for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
                # A CGI-style server may set HTTP_PROXY from a client's "Proxy:" header
                # (httpoxy, CVE-2016-1000110): like urllib, only the lowercase name counts then.
                if name == "HTTP_PROXY" and "REQUEST_METHOD" in environ:
                    continue
                if value := environ.get(name, "").strip():
                    found[scheme] = (value, name)
                    break
        return cls(tuple((scheme, value, name) for scheme, (value, name) in found.items()))

    def proxy_for(self, url: str) -> str | None:
        """The proxy for `url`, or None to go direct; ValueError (naming the variable) when it
        is one the transport cannot speak."""
        parts = urlsplit(url)
        host = parts.hostname
        if host is None or parts.scheme not in ("http", "https"):
            return None
        by_scheme = {scheme: (value, name) for scheme, value, name in self.entries}
        chosen = by_scheme.get(parts.scheme) or by_scheme.get("all")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if chosen is None or ("no" in by_scheme and bypasses(host, port, by_scheme["no"][0])):
            return None
        return check_proxy(chosen[0], f"${chosen[1]}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={hide_credentials(value)!r}" for _, value, name in
                          self.entries)
        return f"ProxyEnvironment({shown})"


def bypasses(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether `NO_PROXY` sends `host` direct, by curl's rules: `*` for every host; a name for
    itself and its subdomains (a leading dot or not); `name:port` for that port only; an
    address, or a range such as `10.0.0.0/8`, for the addresses in it."""
    host = host.lower().strip("[]")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        name, only_port = _entry_port(entry)
        if not name or (only_port is not None and only_port != port):
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


def _entry_port(entry: str) -> tuple[str, int | None]:
    """A NO_PROXY entry split into its host part and its port, if it names one."""
    head, colon, tail = entry.rpartition(":")
    if colon and tail.isdigit() and (head.endswith("]") or ":" not in head):
        return head, int(tail)
    return entry, None


class HttpResponse(Protocol):
    """An upstream's answer: status and headers at once, the body read as it arrives."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (decompressed); BadUpstreamResponse past the link's
        `max_answer_bytes`. With `limit`, at most that many bytes, the rest left unread."""
        ...

    def readany(self) -> Awaitable[bytes]:
        """The next chunk as it arrives; b"" at the end of the body."""
        ...

    def set_exception(self, exc: BaseException) -> None:
        """Fail the pending and later reads with `exc` (how stream timeouts fire)."""
        ...

    def close(self) -> None:
        """Give the connection back (the body was read) or close it (it was not)."""
        ...


class UpstreamSocket(Protocol):
    """An upstream WebSocket once its handshake is done: frames in and out as they are (text as
    `str`, binary as `bytes`), nothing parsed."""

    async def receive(self) -> str | bytes | None:
        """The next data frame; None once the upstream closed (`close_code` says how: None for
        a connection lost without a close frame); ProviderUnavailable when it broke."""
        ...

    async def send(self, frame: str | bytes) -> None:
        """Send one frame, returning once the socket took it (its buffer drained)."""
        ...

    @property
    def close_code(self) -> int | None: ...

    async def close(self, code: int = 1000) -> None:
        """Close the socket (and its connection); idempotent."""
        ...


class Transport(ABC):
    """Sends HTTP requests upstream; one per process, shared by every provider.

    Use it as an async context manager, or `close()` it when done."""

    @abstractmethod
    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      body: bytes | None = None, link: Link = DIRECT,
                      connect_timeout: float = 10.0, compressed: bool = True) -> HttpResponse:
        """Send one request and return once the answer's head has arrived.

        `compressed=False` asks the upstream not to compress (streams: a compressing server may
        hold events back to fill its buffer); headers that already carry `Accept-Encoding` are
        sent as they are. Raises only `errors.ProviderError` subclasses or `errors.Overloaded`."""

    async def websocket(self, url: str, *, headers: Mapping[str, str], link: Link = DIRECT,
                        connect_timeout: float = 10.0, max_frame_bytes: int = 4 << 20
                        ) -> UpstreamSocket:
        """Open a WebSocket (`ws://`, `wss://`) and return once its handshake is done within
        `connect_timeout`; frames over `max_frame_bytes` break it. Raises only
        `errors.ProviderError` subclasses (a refused upgrade by its status, as `request`'s)."""
        raise NotImplementedError("this transport does not open WebSockets")

    def prepare(self, link: Link, provider: str) -> None:  # noqa: B027 - optional hook
        """Ready `link` for `provider`'s requests (TLS files loaded, checked once); ValueError
        naming the field when they cannot be used. Called when a provider is built."""

    @abstractmethod
    async def close(self) -> None:
        """Close every connection; the transport is not used again."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
