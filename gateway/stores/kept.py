"""`Kept`: the gateway's one byte-bounded store of encoded values, with an optional Redis tier.

The response cache (`gateway.cache.store`), the Responses store
(`gateway.adapters.responses.store`) and the idempotent answers keep their values in one: each its
own, with its own bound and Redis prefix. In this process a `Kept` holds at most `max_bytes` (and
`max_entries` values, when given), the least recently used out first, and no value larger than
`max_entry_bytes`. Given the process's one
Redis client
(`gateway.state.redis_sync.redis_client`), it also writes each value to Redis under its `prefix`,
for a time to live, so every worker and replica reads what any of them kept. Redis trouble is never
an error: a read is a miss (or this process's copy), a write is kept here only; the shared-state
sync logs the outage.

Values are bytes; what one means, and whether one read back is valid, is the caller's to say: a
value read from Redis is held here only once the caller `keep`s it.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import TYPE_CHECKING

from gateway.core.redis_errors import redis_trouble

if TYPE_CHECKING:
    from redis.asyncio import Redis


class Kept:
    """Encoded values by key: here, bounded by bytes, and in Redis when given a client."""

    def __init__(self, max_bytes: int, max_entry_bytes: int,
                 redis: Redis | None = None, prefix: str = "",
                 max_entries: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries  # values held in this process; None: bytes alone bound
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self.bytes = 0  # held in this process
        self.redis = redis
        self.trouble = redis_trouble() if redis is not None else ()
        self.prefix = prefix
        self._held: OrderedDict[str, bytes] = OrderedDict()

    def fits(self, encoded: bytes) -> bool:
        """Whether a value is small enough to be kept."""
        return len(encoded) <= self.max_entry_bytes

    @property
    def count(self) -> int:
        """The values held in this process."""
        return len(self._held)

    def held(self, key: str) -> bytes | None:
        """This process's copy, now the most recently used; None when it holds none."""
        encoded = self._held.get(key)
        if encoded is not None:
            self._held.move_to_end(key)
        return encoded

    def keep(self, key: str, encoded: bytes) -> bool:
        """Hold a value in this process only, evicting the least recently used past
        `max_bytes`; False (nothing held) when it does not fit."""
        if not self.fits(encoded):
            return False
        self.forget(key)
        self._held[key] = encoded
        self.bytes += len(encoded)
        while self.bytes > self.max_bytes or (self.max_entries is not None
                                              and len(self._held) > self.max_entries):
            _, evicted = self._held.popitem(last=False)
            self.bytes -= len(evicted)
        return True

    def forget(self, key: str) -> bool:
        """Drop this process's copy; whether it held one."""
        encoded = self._held.pop(key, None)
        if encoded is not None:
            self.bytes -= len(encoded)
        return encoded is not None

    async def get(self, key: str) -> bytes | None:
        """This process's copy, else Redis's (a miss when Redis cannot answer)."""
        if (found := self.held(key)) is not None:
            return found
        with contextlib.suppress(*self.trouble):
            return await self._shared(key)
        return None

    async def latest(self, key: str) -> bytes | None:
        """Redis's value whenever Redis answers, so a value another replica deleted is gone
        here too (this process's copy is dropped); this process's copy while Redis cannot
        answer, or without Redis."""
        if self.redis is None:
            return self.held(key)
        try:
            found = await self._shared(key)
        except self.trouble:
            return self.held(key)
        if found is None:
            self.forget(key)
        else:
            self.held(key)  # this process's copy, if any, is now the most recently used
        return found

    async def put(self, key: str, encoded: bytes, ttl: float) -> bool:
        """Keep a value here and, for `ttl` seconds (if any are left), in Redis; False (kept
        nowhere) when it does not fit."""
        if not self.keep(key, encoded):
            return False
        if self.redis is not None and ttl > 0:
            with contextlib.suppress(*self.trouble):
                await self.redis.set(self.prefix + key, encoded, px=max(1, int(ttl * 1000)))
        return True

    async def delete(self, key: str) -> bool:
        """Forget a value here and in Redis; whether either held it."""
        held = self.forget(key)
        if self.redis is None:
            return held
        try:
            return bool(await self.redis.delete(self.prefix + key)) or held
        except self.trouble:
            return held

    async def _shared(self, key: str) -> bytes | None:
        """Redis's value, None when it has none that fits; raises when Redis cannot answer."""
        if self.redis is None:
            return None
        stored = await self.redis.get(self.prefix + key)
        return stored if isinstance(stored, bytes) and self.fits(stored) else None
