"""Recent responses, so a follow-up turn can say `previous_response_id`.

Each stored response keeps only what it added to its conversation (its input and its output, as
chat messages) and the id of the response before it: a long conversation costs each turn once, not
its whole history again at every turn. `get` walks the chain back; if any link was evicted, the
conversation cannot be rebuilt and it is a miss, never a silently shortened history.

Bounded by bytes (`responses.store_max_bytes`; the turns least recently stored or continued are
evicted first), and a turn larger than `responses.store_max_entry_bytes` is not stored at all (the
answer says `store: false`). Turns are kept in a `gateway.stores.kept.Kept`: with the Redis state
backend in Redis too, so any worker or replica can continue a conversation another one started.
Redis trouble never fails a request, and a value there that is not a stored turn is a miss.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.responses.request import input_messages
from gateway.core.schemas import InputItem, check_items
from gateway.core.settings import DEFAULT_STORE_MAX_BYTES, DEFAULT_STORE_MAX_ENTRY_BYTES
from gateway.stores.kept import Kept
from providers.contract.chat import Message

if TYPE_CHECKING:
    from redis.asyncio import Redis

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
    """Stored turns, encoded, in a `gateway.stores.kept.Kept`: at most `max_bytes` in this process,
    least recently stored or continued evicted first; with the process's Redis client, in Redis
    too for a week, shared by every gateway process."""

    def __init__(self, max_bytes: int = DEFAULT_STORE_MAX_BYTES,
                 max_entry_bytes: int = DEFAULT_STORE_MAX_ENTRY_BYTES,
                 redis: Redis | None = None, prefix: str = "") -> None:
        self.kept = Kept(max_bytes, max_entry_bytes, redis, f"{prefix}response:")

    def encode(self, turn: StoredTurn) -> bytes | None:
        """The turn as it would be stored, or None when it is too large to be."""
        encoded = msgspec.json.encode(turn)
        return encoded if self.kept.fits(encoded) else None

    async def put(self, response_id: str, encoded: bytes) -> None:
        """Keep an encoded turn (`encode`), evicting the oldest past the byte bound. On Redis
        trouble the local copy still serves this process."""
        await self.kept.put(response_id, encoded, REDIS_TTL)

    async def get(self, response_id: str, key_id: str | None = None
                  ) -> list[dict[str, Any]] | None:
        """The whole conversation up to and including `response_id`, or None if any of its
        turns is not held or `key_id` may not continue it (`continues`)."""
        turns: list[StoredTurn] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None and len(turns) < MAX_CHAIN:
            if at in seen:  # a loop is no conversation (only a forged value can make one)
                return None
            seen.add(at)
            # Redis first: a turn another replica deleted ends the conversation here too.
            # A turn held here is now recently used, so a conversation in use keeps its
            # earliest turns while turns nobody continues are evicted first.
            encoded = await self.kept.latest(at)
            turn = None if encoded is None else _decoded(encoded)
            if turn is None or (not turns and not continues(turn, key_id)):
                return None
            turns.append(turn)
            at = turn.previous
        if at is not None:
            return None
        return [message for turn in reversed(turns)
                for message in input_messages(turn.input) + turn.messages]

    async def turn(self, response_id: str) -> StoredTurn | None:
        """One stored response, or None. Redis first: a response another replica deleted is
        gone here too (this process's copy answers only while Redis cannot)."""
        encoded = await self.kept.latest(response_id)
        return None if encoded is None else _decoded(encoded)

    async def delete(self, response_id: str) -> bool:
        """Forget a response; whether it was held. A conversation through it ends here."""
        return await self.kept.delete(response_id)

    # Last in the class: above it, `bytes` in an annotation would name this property.
    @property
    def bytes(self) -> int:
        """The bytes held in this process."""
        return self.kept.bytes


def readable(turn: StoredTurn, key_id: str | None, admin: bool = False) -> bool:
    """Whether a request with key `key_id` (None: no client keys configured) may read `turn`:
    its creator, an admin key, or anyone when the gateway has no client keys."""
    return key_id is None or admin or turn.owner == key_id


def continues(turn: StoredTurn, key_id: str | None) -> bool:
    """Whether a request with key `key_id` may continue `turn`: only its creator (an admin
    key reads every response, but continuing one would send its text inside the admin's
    request and bill it there), or anyone when the gateway has no client keys."""
    return readable(turn, key_id)


def _decoded(encoded: bytes) -> StoredTurn | None:
    """The stored turn, or None when the value is not one (not JSON, or not of its shape)."""
    try:
        _CHECKED.decode(encoded)
        return _TURNS.decode(encoded)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
