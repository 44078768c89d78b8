"""What the semantic cache keeps, in three `gateway.stores.kept.Kept`s shared through Redis.

- the *index*: per partition (`gateway.cache.semantic.Question.partition`), its entries' ids
  and when each expires, the newest `PARTITION_ENTRIES` of them; read from Redis on every
  lookup when there is one, so an entry any replica kept is found at once;
- the *vectors*: per entry, its question's unit vector (never changes once written, so this
  process's copy is read first);
- the *answers*: per entry, the answer as the exact cache keeps one (`gateway.cache.store`),
  checked as strictly when it comes back from Redis.

Each process holds at most `max_bytes` of them (answers 5/8, vectors 1/4, the index 1/8) and
`max_entries` entries, the least recently used out first. Two replicas keeping into one
partition at the same instant may lose one of the two entries: a later miss, never a wrong
answer.
"""

from __future__ import annotations

import asyncio
import os
import time
from array import array
from typing import TYPE_CHECKING

import msgspec

from gateway.cache import semantic
from gateway.cache.store import Cached, ResponseCache
from gateway.stores.kept import Kept

if TYPE_CHECKING:
    from redis.asyncio import Redis

# The entries one partition holds, newest kept: every lookup compares its question with each.
PARTITION_ENTRIES = 128
_MAX_VECTOR_BYTES = 4 * 8192  # 8192 dimensions: more than any embedding model writes


class Entry(msgspec.Struct, frozen=True, array_like=True):
    """One kept question of a partition: its id, and when its answer expires."""

    id: str
    expires: float


_INDEX = msgspec.msgpack.Decoder(list[Entry])
_ENCODE = msgspec.msgpack.Encoder()


class SemanticStore:
    """Questions by partition, their vectors and their answers: here, bounded, and in Redis
    when given the process's client."""

    def __init__(self, max_bytes: int, max_entry_bytes: int, max_entries: int,
                 redis: Redis | None = None, prefix: str = "") -> None:
        base = f"{prefix}semantic:"
        self.answers = ResponseCache(max_bytes * 5 // 8, max_entry_bytes, redis, base,
                                     max_entries=max_entries)
        self.vectors = Kept(max_bytes // 4, _MAX_VECTOR_BYTES, redis, f"{base}vector:",
                            max_entries)
        self.index = Kept(max_bytes // 8, PARTITION_ENTRIES * 64, redis, f"{base}index:",
                          max_entries)

    @property
    def max_entry_bytes(self) -> int:
        """The largest answer kept."""
        return self.answers.max_entry_bytes

    async def nearest(self, partition: str, vector: array[float]) -> tuple[str, float] | None:
        """The entry of `partition` whose question is nearest `vector`, and its similarity."""
        entries = await self._entries(partition)
        vectors = await asyncio.gather(*(self._vector(entry.id) for entry in entries))
        return semantic.nearest(vector, [(entry.id, found) for entry, found
                                         in zip(entries, vectors, strict=True)
                                         if found is not None])

    async def answer(self, entry: str) -> Cached | None:
        """The answer kept for an entry, if it is still fresh and sound."""
        return await self.answers.get(entry)

    async def keep(self, partition: str, vector: array[float], cached: Cached) -> int:
        """Keep an answer to a question of `partition`; the bytes it takes (0: not kept)."""
        entry = Entry(os.urandom(12).hex(), cached.expires)
        size = await self.answers.put(entry.id, cached)
        if not size:
            return 0
        ttl = cached.expires - time.time()
        await self.vectors.put(entry.id, vector.tobytes(), ttl)
        entries = [*await self._entries(partition), entry][-PARTITION_ENTRIES:]
        await self.index.put(partition, _ENCODE.encode(entries),
                             max(e.expires for e in entries) - time.time())
        return size

    async def _entries(self, partition: str) -> list[Entry]:
        """The partition's entries still fresh, oldest first (none when its index is not one)."""
        encoded = await self.index.latest(partition)
        if encoded is None:
            return []
        try:
            entries = _INDEX.decode(encoded)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return []
        now = time.time()
        return [entry for entry in entries if entry.expires > now]

    async def _vector(self, entry: str) -> array[float] | None:
        encoded = self.vectors.held(entry)
        if encoded is None:
            if (encoded := await self.vectors.get(entry)) is None or len(encoded) % 4:
                return None
            self.vectors.keep(entry, encoded)
        vector = array("f")
        vector.frombytes(encoded)
        return vector
