"""The one interface every upstream HTTP call goes through: relay, pool health, discovery, CLI.

A kind sends a request through its `Transport` and reads the `HttpResponse` it gets back; which
library carries the bytes is the implementation's business (`providers.transport`, aiohttp), and
the library's exceptions are translated into the error tree (`errors`) there, in one place:

    connect refused / reset / DNS failure      ProviderUnavailable
    no connection within `connect_timeout`     ConnectTimeout
    no file descriptor left                    Overloaded (the gateway's limit, not the provider's)
    malformed answer, bad or oversized body    BadUpstreamResponse
    TLS verification failure                   ProviderUnavailable (names the certificate problem)

How one upstream is reached (its proxy, its TLS options, how big an answer may be) is a `Link`,
built once per provider from its spec.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol

# The largest whole answer (also after decompression) unless llms.json says otherwise.
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """A provider's `"tls"` in llms.json: a private CA, a client certificate, or no checks."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


@dataclass(frozen=True, slots=True)
class Link:
    """How to reach one upstream: through which proxy (None: directly), with which TLS options,
    and how many bytes a whole answer may take."""

    proxy: str | None = None
    tls: TlsOptions | None = None
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES


DIRECT = Link()


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


class Transport(ABC):
    """Sends HTTP requests upstream; one per process, shared by every provider."""

    @abstractmethod
    async def request(self, method: str, url: str, *, headers: Mapping[str, str],
                      body: bytes | None = None, link: Link = DIRECT,
                      connect_timeout: float = 10.0, compressed: bool = True) -> HttpResponse:
        """Send one request and return once the answer's head has arrived.

        `compressed=False` asks the upstream not to compress (streams: a compressing server may
        hold events back to fill its buffer). Raises only `errors.ProviderError` subclasses or
        `errors.Overloaded`."""

    @abstractmethod
    async def close(self) -> None:
        """Close every connection; the transport is not used again."""
