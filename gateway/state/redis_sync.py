"""Share breaker trips and cooldowns between processes and replicas through Redis.

Redis stays off the hot path: a request consults only the local `ProviderHealth`. Local trips
and cooldowns are queued as they happen; every `sync_interval` one task writes the queue to a
Redis hash and reads back what the other processes wrote, so a provider one replica saw fail is
skipped by the others within a second. If Redis is down the gateway serves on local state, logs
once, and reconnects by itself.

A process has one Redis client (`redis_client`, entered by the app's lifespan), shared by this
sync (breakers, rate-limit counts, latencies), the response cache and the Responses store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import msgspec

from gateway.core.limits import WINDOW, RateLimiter
from gateway.core.redis_errors import redis_trouble
from gateway.core.settings import StateConfig
from gateway.routing.health import Change, ProviderHealth
from gateway.routing.strategy import Latencies
from providers.contract.log import get_logger
from providers.contract.spec import Retries

if TYPE_CHECKING:
    import redis.asyncio as aioredis

_SEPARATOR = "\x1f"
LATENCY_TTL = 3600  # what no replica refreshed for an hour is forgotten
LATENCY_CAP = 3600.0  # an average past this is not one any gateway measured


@contextlib.asynccontextmanager
async def redis_client(config: StateConfig) -> AsyncIterator[aioredis.Redis | None]:
    """The process's one Redis client, closed on leaving; None with the memory backend. It
    connects when first used, so a Redis that is down delays nothing here."""
    if config.backend != "redis":
        yield None
        return
    import redis.asyncio  # only here: a gateway without Redis never loads it

    client = redis.asyncio.from_url(config.url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        yield client
    finally:
        with contextlib.suppress(*redis_trouble()):
            await client.aclose()


class _Stored(msgspec.Struct, array_like=True):
    until: float
    trips: int


def encode(change: Change) -> tuple[str, bytes]:
    """A change as a hash field and value."""
    field = f"{change.provider}{_SEPARATOR}{change.model or ''}"
    return field, msgspec.json.encode(_Stored(change.until, change.trips))


def decode(field: bytes | str, value: bytes | str) -> Change:
    """The inverse of `encode`."""
    text = field.decode() if isinstance(field, bytes) else field
    provider, _, model = text.partition(_SEPARATOR)
    stored = msgspec.json.decode(value, type=_Stored)
    return Change(provider, model or None, stored.until, stored.trips)


class RedisSync:
    """Keeps one process's `ProviderHealth` in step with every other process's, through the
    process's one Redis client (`redis_client`: closed by its owner, not here)."""

    def __init__(self, config: StateConfig, client: aioredis.Redis, health: ProviderHealth,
                 limiter: RateLimiter | None = None,
                 longest_cooldown: Callable[[str], float] | None = None,
                 latencies: Latencies | None = None) -> None:
        self.config = config
        self.health = health
        self.limiter = limiter
        # The longest a provider's 429 cooldown is believed, by provider name.
        self.longest_cooldown = longest_cooldown or (lambda _: Retries().max_retry_after)
        self.key = f"{config.prefix}health"
        self.pending: deque[Change] = deque(maxlen=10_000)
        self.connected: bool | None = None  # None until the first sync says which
        self._client = client
        self.trouble = redis_trouble()
        health.listeners.append(self.pending.append)
        # What the latency strategy learned here, since the last sync (latest per route).
        self.latency_key = f"{config.prefix}latency"
        self.latencies = latencies
        self.measured: dict[tuple[str, str], float] = {}
        if latencies is not None:
            latencies.listeners.append(self.measured.__setitem__)

    async def run(self) -> None:
        """Sync forever; never raises for a Redis failure."""
        while True:
            await self.sync_once()
            await asyncio.sleep(self.config.sync_interval)

    async def sync_once(self) -> None:
        """Write local changes, read everyone's; mark Redis up or down."""
        await self._sync_health()
        if self.limiter is not None and self.connected:
            await self._sync_counts(self.limiter)
        if self.latencies is not None and self.connected:
            await self._sync_latencies(self.latencies)

    async def _sync_latencies(self, latencies: Latencies) -> None:
        """Each replica writes its latest averages; every replica reads them all, so a slow
        provider one replica measured goes last on the others too."""
        measured = dict(self.measured)  # the listener holds this dict: emptied, not replaced
        self.measured.clear()
        try:
            if measured:
                await self._client.hset(self.latency_key, mapping={
                    f"{p}{_SEPARATOR}{m}": repr(v) for (p, m), v in measured.items()})
                await self._client.expire(self.latency_key, LATENCY_TTL)
            stored = await self._client.hgetall(self.latency_key)
        except self.trouble as exc:
            self._mark(False, exc)
            return
        for field, value in stored.items():
            try:
                text = field.decode() if isinstance(field, bytes) else str(field)
                provider, _, model = text.partition(_SEPARATOR)
                average = float(value)
            except (UnicodeDecodeError, ValueError):
                continue  # not what any gateway writes
            if (provider, model) not in measured and average >= 0 and average < LATENCY_CAP:
                latencies.learned((provider, model), average)

    async def _sync_counts(self, limiter: RateLimiter) -> None:
        # INCRBY returns the cluster total; INCRBY 0 refreshes a window we added nothing to.
        pending = limiter.take_pending()
        window = int(limiter.clock() // WINDOW)  # the limiter's own clock, as it counts
        counted = set(pending) | {c for c in limiter.local if c[1] == window}
        ordered = sorted(counted)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key_id, at, kind in ordered:
                    name = f"{self.config.prefix}rate:{key_id}:{at}:{kind}"
                    pipe.incrby(name, pending.get((key_id, at, kind), 0))
                    pipe.expire(name, 2 * WINDOW)
                replies = await pipe.execute()
        except self.trouble as exc:
            limiter.restore(pending)
            self._mark(False, exc)
            return
        limiter.apply_totals({c: int(total) for c, total in zip(ordered, replies[::2],
                                                                 strict=True)})

    async def _sync_health(self) -> None:
        batch = list(self.pending)
        try:
            if batch:
                await self._client.hset(self.key, mapping=dict(encode(c) for c in batch))
            stored = await self._client.hgetall(self.key)
        except self.trouble as exc:
            self._mark(False, exc)
            return
        for _ in batch:
            self.pending.popleft()
        self._mark(True)
        now = time.time()
        expired = []
        for field, value in stored.items():
            try:
                change = decode(field, value)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
                # Not what any gateway writes: skipped (and dropped), never a crash.
                get_logger().warning("shared_state_value_ignored", field=repr(field)[:100])
                expired.append(field)
                continue
            if change.until <= now:
                expired.append(field)
                continue
            if change.model is None and change.until > now + (
                    longest := self.longest_cooldown(change.provider)):
                # A cooldown longer than this gateway believes any 429 (an older version's, or
                # a replica's configured otherwise): held that long from now, then forgotten,
                # so a Retry-After in 2099 never benches a provider for good through Redis.
                change = dataclasses.replace(change, until=now + longest)
                expired.append(field)
            self.health.apply_remote(change)
        if expired:
            try:
                await self._client.hdel(self.key, *expired)
            except self.trouble as exc:
                self._mark(False, exc)

    def _mark(self, up: bool, error: BaseException | None = None) -> None:
        if up == self.connected:
            return
        log = get_logger()
        if up:
            log.info("shared_state_connected", backend="redis")
        else:
            log.warning("shared_state_unavailable", backend="redis",
                        error=type(error).__name__ if error else None,
                        action="serving on local state; reconnecting")
        self.connected = up
