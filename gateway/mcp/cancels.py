"""A client's `notifications/cancelled` (2025-11-25) reaches the call it names, on whichever
replica runs it: each replica keeps the calls it runs by session and request id, and with Redis
a cancellation this replica does not run is published for the others (`listen`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.core.redis_errors import redis_trouble
from providers.contract.log import get_logger

if TYPE_CHECKING:
    from redis.asyncio import Redis


def _key(session_id: str, request_id: Any) -> str:
    return f"{session_id} {msgspec.json.encode(request_id).decode()}"


class Cancels:
    """The tool calls this process runs for sessions, by what a cancellation names."""

    def __init__(self, redis: Redis | None, prefix: str) -> None:
        self.redis = redis
        self.channel = f"{prefix}mcp:cancel"
        self.running: dict[str, asyncio.Future[Any]] = {}

    @contextlib.contextmanager
    def running_as(self, session_id: str | None, request_id: Any, call: asyncio.Future[Any]
                   ) -> Iterator[None]:
        """While `call` runs, a cancellation of (`session_id`, `request_id`) cancels it."""
        if session_id is None:
            yield
            return
        key = _key(session_id, request_id)
        self.running[key] = call
        try:
            yield
        finally:
            if self.running.get(key) is call:
                del self.running[key]

    async def cancel(self, session_id: str, request_id: Any) -> None:
        """Cancel the call, here or, through Redis, on the replica that runs it."""
        key = _key(session_id, request_id)
        if (call := self.running.get(key)) is not None:
            call.cancel()
        elif self.redis is not None:
            with contextlib.suppress(*redis_trouble()):
                await self.redis.publish(self.channel, key)

    async def listen(self) -> None:
        """Forever (with Redis): cancellations published by other replicas, applied here."""
        if self.redis is None:
            await asyncio.Event().wait()
            return
        pubsub = self.redis.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            async for message in pubsub.listen():
                if message.get("type") != "message":
                    continue
                data = message.get("data")
                key = data.decode() if isinstance(data, bytes) else str(data)
                if (call := self.running.get(key)) is not None:
                    get_logger().info("mcp_call_cancelled_elsewhere")
                    call.cancel()
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
