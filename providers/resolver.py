"""An upstream's host name to its addresses: looked up once for all waiting connections, kept
for `ttl`, refreshed behind the requests' backs, and kept through a DNS failure.

Without it every new upstream connection asked the system resolver, through libuv's pool of four
threads: a burst of 1,000 new streams to a remote API was 1,000 lookups queued four at a time,
and a resolver that stopped answering failed every new connection. aiohttp's connector, which
`wire` replaced, cached lookups for 10 s; this keeps that, and like Envoy's DNS cache never
holds a request for a refresh once the host has resolved: stale addresses serve (RFC 8767) until
a refresh answers, or until every one of them fails to connect (`forget`). An address that does
not answer in time goes last (`demote`).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Sequence

from providers.contract.errors import ProviderUnavailable
from providers.contract.log import get_logger

# aiohttp's default (`ttl_dns_cache`): how long a lookup's answer is used before a refresh.
TTL = 10.0

Lookup = Callable[[str, int], Awaitable[Sequence[str]]]


async def system_lookup(host: str, port: int) -> list[str]:
    """The system resolver's addresses for a TCP connection, in its order of preference."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class HostAddresses:
    """One origin's addresses, for its connection pool."""

    __slots__ = ("_addresses", "_fresh_until", "_lookup", "_refreshing", "_slow", "host", "port",
                 "ttl")

    def __init__(self, host: str, port: int, ttl: float = TTL, lookup: Lookup = system_lookup
                 ) -> None:
        self.host = host
        self.port = port
        self.ttl = ttl
        self._lookup = lookup
        self._addresses: tuple[str, ...] = ()
        self._fresh_until = 0.0
        self._refreshing: asyncio.Task[tuple[str, ...]] | None = None
        self._slow: set[str] = set()  # timed out once: tried last, through refreshes too

    async def get(self) -> tuple[str, ...]:
        """The addresses to try in order; waits only when none are known yet."""
        refreshing = self._refreshing
        if refreshing is None and time.monotonic() >= self._fresh_until:
            refreshing = self._refreshing = self._start_refresh()
        if self._addresses:
            return self._addresses
        assert refreshing is not None  # none known, so never fresh: a lookup is under way
        # Shielded: a request that gives up does not cancel the lookup others wait on.
        return await asyncio.shield(refreshing)

    def demote(self, address: str) -> None:
        """`address` did not answer in time: try it after the others from now on."""
        self._slow.add(address)
        self._addresses = _slow_last(self._addresses, self._slow)

    def forget(self) -> None:
        """Every address failed: the next connection waits for a fresh lookup."""
        self._addresses = ()
        self._fresh_until = 0.0

    def _start_refresh(self) -> asyncio.Task[tuple[str, ...]]:
        task = asyncio.get_running_loop().create_task(self._refresh())
        task.add_done_callback(_retrieved)
        return task

    async def _refresh(self) -> tuple[str, ...]:
        try:
            found = tuple(await self._lookup(self.host, self.port))
            if not found:
                raise socket.gaierror(socket.EAI_NONAME, "no addresses")
        except (OSError, UnicodeError) as exc:  # gaierror; a name IDNA refuses
            if self._addresses:
                get_logger().warning("dns_refresh_failed", host=self.host, error=str(exc),
                                     kept=len(self._addresses))
                self._fresh_until = time.monotonic() + self.ttl
                return self._addresses
            raise ProviderUnavailable("cannot resolve the provider's host name") from None
        finally:
            self._refreshing = None
        self._addresses = _slow_last(found, self._slow)
        self._fresh_until = time.monotonic() + self.ttl
        return self._addresses


def _slow_last(addresses: tuple[str, ...], slow: set[str]) -> tuple[str, ...]:
    return (*(a for a in addresses if a not in slow), *(a for a in addresses if a in slow))


def _retrieved(task: asyncio.Task[tuple[str, ...]]) -> None:
    # A failed lookup whose waiters all left is not "never retrieved" noise in the log.
    if not task.cancelled():
        task.exception()
