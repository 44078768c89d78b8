"""Answers remembered by `Idempotency-Key`, so a client's retry is replayed, never run again.

One entry per key: the hash of the body that made it, and the answer as it was sent (a whole
body, or a stream's bytes), for `idempotency.ttl` seconds. Only complete, successful answers are
remembered (`gateway.idempotency.flight` decides). Kept in a `gateway.stores.kept.Kept`: in this
process bounded by bytes (least recently used out first), and with the Redis state backend in Redis
too, so a retry that reaches another replica is replayed there. An answer larger than
`idempotency.max_entry_bytes` is not remembered at all: its retry runs again. Redis trouble is a
miss (the retry runs), never a failure; a value there that is not an entry is a miss too.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from gateway.core.settings import (
    DEFAULT_IDEMPOTENCY_LEASE,
    DEFAULT_IDEMPOTENCY_MAX_BYTES,
    DEFAULT_IDEMPOTENCY_MAX_ENTRY_BYTES,
)
from gateway.idempotency.claims import Claims
from gateway.stores.kept import Kept

if TYPE_CHECKING:
    from redis.asyncio import Redis



class Remembered(msgspec.Struct, frozen=True):
    """One completed answer: the hash of the body that asked for it, when it is forgotten, and
    what was sent (`body`: a whole answer's bytes, or a stream's bytes when `stream`)."""

    digest: str
    expires: float
    media_type: str
    body: bytes
    stream: bool = False
    provider: str | None = None
    alias: str | None = None


_REMEMBERED = msgspec.msgpack.Decoder(Remembered)


def key_of(scope: str | None, endpoint: str, sent: str) -> str:
    """Where a key's entry lives: the header's value, scoped to the client key's id (None
    without client keys) and the endpoint, so one key never reads another's answers."""
    identity = msgspec.json.encode([scope, endpoint, sent])
    return hashlib.sha256(identity).hexdigest()


def digest_of(body: bytes) -> str:
    """The hash a retry's body must match: of its JSON with keys sorted and no spacing, so
    the same request from another client library (another key order, other whitespace)
    matches; of its bytes when it is not JSON."""
    try:
        canonical = msgspec.json.encode(msgspec.json.decode(body), order="sorted")
    except msgspec.DecodeError:
        canonical = body
    return hashlib.sha256(canonical).hexdigest()


class IdempotencyStore:
    """Remembered answers by key (`key_of`), at most `max_bytes` in this process; with the
    process's Redis client, in Redis too for each entry's time to live."""

    def __init__(self, max_bytes: int = DEFAULT_IDEMPOTENCY_MAX_BYTES,
                 max_entry_bytes: int = DEFAULT_IDEMPOTENCY_MAX_ENTRY_BYTES,
                 redis: Redis | None = None,
                 prefix: str = "", clock: Callable[[], float] = time.time,
                 lease: float = DEFAULT_IDEMPOTENCY_LEASE) -> None:
        self.kept = Kept(max_bytes, max_entry_bytes, redis, f"{prefix}idempotency:")
        self.clock = clock  # wall time: entries' expiries are shared with other replicas
        # Which replica runs a keyed request still running (with Redis).
        self.claims = Claims(redis, prefix, lease)

    @property
    def max_entry_bytes(self) -> int:
        """The largest answer remembered (a running stream past it is no longer joinable)."""
        return self.kept.max_entry_bytes

    async def get(self, key: str) -> Remembered | None:
        """The entry for `key` while it is fresh; None when there is none (or it expired)."""
        encoded = await self.kept.get(key)
        if encoded is None:
            return None
        try:
            found = _REMEMBERED.decode(encoded)
        except (msgspec.DecodeError, msgspec.ValidationError):
            await self.kept.delete(key)  # not what this gateway writes: no replica reads it
            return None
        if found.expires <= self.clock():
            self.kept.forget(key)  # Redis forgets it on its own, at the same time
            return None
        self.kept.keep(key, encoded)  # most recently used; held here if it came from Redis
        return found

    async def put(self, key: str, entry: Remembered) -> bool:
        """Remember an answer until its `expires`; False when it is too large to be."""
        return await self.kept.put(key, msgspec.msgpack.encode(entry),
                                   entry.expires - self.clock())

    # Last in the class: above it, `bytes` in an annotation would name this property.
    @property
    def bytes(self) -> int:
        """The bytes held in this process."""
        return self.kept.bytes
