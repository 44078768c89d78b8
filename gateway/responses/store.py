"""Recent responses, so a follow-up turn can say `previous_response_id`.

Each stored response keeps only what it added to its conversation (its input and its output, as
chat messages) and the id of the response before it: a long conversation costs each turn once,
not its whole history again at every turn. `get` walks the chain back; if any link was evicted,
the conversation cannot be rebuilt and it is a miss, never a silently shortened history.

Bounded by bytes (`responses.store_max_bytes`; the turns least recently stored or continued are
evicted first), and a turn larger than `responses.store_max_entry_bytes` is not stored at all
(the answer says `store: false`). With the Redis state backend turns are also kept in Redis, so
any worker or replica can continue a conversation another one started. Redis trouble never
fails a request, and a value there that is not a stored turn is a miss.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.responses.request import input_messages
from gateway.schemas import InputItem, Message, check_items

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ENTRY_BYTES = 16 * 1024 * 1024
# Turns walked back from one response: a conversation longer than this is not continued.
MAX_CHAIN = 10_000
REDIS_TTL = 7 * 24 * 3600


class StoredTurn(msgspec.Struct, frozen=True, omit_defaults=True):
    """What one response added to its conversation: its `input` as the client sent it, its
    output as chat messages, and the response it continued; for `GET /v1/responses/{id}`, the
    response as answered (its JSON, kept undecoded; empty when not kept) and the id of the key
    that created it (None without keys)."""

    messages: list[dict[str, Any]]
    previous: str | None = None
    input: str | list[dict[str, Any]] | None = None
    response: msgspec.Raw = msgspec.Raw()
    owner: str | None = None


class _CheckedTurn(msgspec.Struct, frozen=True):
    """A stored turn's shape, typed as a request's are: what the store hands back goes to the
    same translators, so a value that is not of this shape is a miss."""

    messages: list[Message]
    previous: str | None = None
    input: str | list[InputItem] | None = None
    response: dict[str, Any] | None = None
    owner: str | None = None

    def __post_init__(self) -> None:
        check_items(self.input)


_TURNS = msgspec.json.Decoder(StoredTurn)
_CHECKED = msgspec.json.Decoder(_CheckedTurn)


class ResponseStore:
    """Stored turns, encoded, in memory: at most `max_bytes` of them, least recently stored or
    continued evicted first."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = min(max_entry_bytes, max_bytes)
        self.bytes = 0
        self._turns: OrderedDict[str, bytes] = OrderedDict()

    def encode(self, turn: StoredTurn) -> bytes | None:
        """The turn as it would be stored, or None when it is too large to be."""
        encoded = msgspec.json.encode(turn)
        return encoded if len(encoded) <= self.max_entry_bytes else None

    async def put(self, response_id: str, encoded: bytes) -> None:
        """Keep an encoded turn (`encode`), evicting the oldest past the byte bound."""
        self._keep(response_id, encoded)

    def _keep(self, response_id: str, encoded: bytes) -> None:
        if (old := self._turns.pop(response_id, None)) is not None:
            self.bytes -= len(old)
        self._turns[response_id] = encoded
        self.bytes += len(encoded)
        while self.bytes > self.max_bytes:
            _, evicted = self._turns.popitem(last=False)
            self.bytes -= len(evicted)

    async def get(self, response_id: str) -> list[dict[str, Any]] | None:
        """The whole conversation up to and including `response_id`, or None if any of its
        turns is not held."""
        turns: list[StoredTurn] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None and len(turns) < MAX_CHAIN:
            if at in seen:  # a loop is no conversation (only a forged value can make one)
                return None
            seen.add(at)
            turn = await self._turn(at)
            if turn is None:
                return None
            turns.append(turn)
            at = turn.previous
        if at is not None:
            return None
        return [message for turn in reversed(turns)
                for message in input_messages(turn.input) + turn.messages]

    async def turn(self, response_id: str) -> StoredTurn | None:
        """One stored response, or None."""
        return await self._turn(response_id)

    async def delete(self, response_id: str) -> bool:
        """Forget a response; whether it was held. A conversation through it ends here."""
        encoded = self._turns.pop(response_id, None)
        if encoded is not None:
            self.bytes -= len(encoded)
        return encoded is not None

    async def _turn(self, response_id: str) -> StoredTurn | None:
        encoded = self._turns.get(response_id)
        if encoded is None:
            return None
        # Continued: kept as recently used, so a conversation in use keeps its earliest turns
        # while turns nobody continues are evicted first.
        self._turns.move_to_end(response_id)
        return _decoded(encoded)

    async def close(self) -> None:
        """Release connections, if any."""


def _decoded(encoded: bytes) -> StoredTurn | None:
    """The stored turn, or None when the value is not one (not JSON, or not of its shape)."""
    try:
        _CHECKED.decode(encoded)
        return _TURNS.decode(encoded)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


class RedisResponseStore(ResponseStore):
    """Also keeps each turn in Redis for a week, shared by every gateway process."""

    def __init__(self, url: str, prefix: str, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES) -> None:
        super().__init__(max_bytes, max_entry_bytes)
        self.prefix = f"{prefix}response:"
        self._client = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

    async def put(self, response_id: str, encoded: bytes) -> None:
        self._keep(response_id, encoded)
        # On failure the local copy still serves this process; the state sync logs the outage.
        with contextlib.suppress(RedisError, OSError):
            await self._client.set(self.prefix + response_id, encoded, ex=REDIS_TTL)

    async def _turn(self, response_id: str) -> StoredTurn | None:
        if (found := await super()._turn(response_id)) is not None:
            return found
        try:
            stored = await self._client.get(self.prefix + response_id)
        except (RedisError, OSError):
            return None
        if not isinstance(stored, bytes) or len(stored) > self.max_entry_bytes:
            return None
        return _decoded(stored)

    async def turn(self, response_id: str) -> StoredTurn | None:
        """Redis first: a response another replica deleted is gone here too (this process's
        copy answers only while Redis cannot)."""
        try:
            stored = await self._client.get(self.prefix + response_id)
        except (RedisError, OSError):
            return await super().turn(response_id)
        if not isinstance(stored, bytes) or len(stored) > self.max_entry_bytes:
            await super().delete(response_id)
            return None
        return _decoded(stored)

    async def delete(self, response_id: str) -> bool:
        held = await super().delete(response_id)
        try:
            return bool(await self._client.delete(self.prefix + response_id)) or held
        except (RedisError, OSError):
            return held

    async def close(self) -> None:
        await self._client.aclose()
