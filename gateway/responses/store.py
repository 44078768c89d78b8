"""Recent responses, so a follow-up turn can say `previous_response_id`.

In memory (bounded) by default; with the Redis state backend also in Redis, so any worker or
replica can continue a conversation another one started. Redis trouble never fails a request:
the local copy still answers, and a miss is a miss.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

DEFAULT_CAPACITY = 10_000
REDIS_TTL = 7 * 24 * 3600


class ResponseStore:
    """The conversation up to and including each stored response, as chat messages."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._turns: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    async def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._turns[response_id] = messages
        self._turns.move_to_end(response_id)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    async def get(self, response_id: str) -> list[dict[str, Any]] | None:
        return self._turns.get(response_id)

    async def close(self) -> None:
        """Release connections, if any."""


class RedisResponseStore(ResponseStore):
    """Also keeps each conversation in Redis for a week, shared by every gateway process."""

    def __init__(self, url: str, prefix: str, capacity: int = DEFAULT_CAPACITY) -> None:
        super().__init__(capacity)
        self.prefix = f"{prefix}response:"
        self._client = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

    async def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        await super().put(response_id, messages)
        # On failure the local copy still serves this process; the state sync logs the outage.
        with contextlib.suppress(RedisError, OSError):
            await self._client.set(self.prefix + response_id, msgspec.json.encode(messages),
                                   ex=REDIS_TTL)

    async def get(self, response_id: str) -> list[dict[str, Any]] | None:
        if (found := await super().get(response_id)) is not None:
            return found
        try:
            stored = await self._client.get(self.prefix + response_id)
        except (RedisError, OSError):
            return None
        return msgspec.json.decode(stored) if stored else None

    async def close(self) -> None:
        await self._client.aclose()
