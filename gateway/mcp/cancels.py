"""A client's `notifications/cancelled` (2025-11-25) reaches the call it names, on whichever
replica runs it: each replica keeps the calls it runs by session and request id, and with Redis
a cancellation this replica does not run is published for the others (`listen`). A replica
subscribes before the first session call it runs (`ready`), so a gateway no MCP client uses holds
no subscription (and no Redis connection) for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.core.redis_errors import redis_trouble
from providers.contract.log import get_logger

if TYPE_CHECKING:
    from redis.asyncio import Redis


def _key(session_id: str, request_id: Any) -> str:
    return f"{session_id} {msgspec.json.encode(request_id).decode()}"


SUBSCRIBING = 1.0  # seconds a first session call waits for the subscription


class Cancels:
    """The tool calls this process runs for sessions, by what a cancellation names."""

    def __init__(self, redis: Redis | None, prefix: str,
                 start: Callable[[str, Callable[[], Awaitable[None]]], None]) -> None:
        self.redis = redis
        self.channel = f"{prefix}mcp:cancel"
        self.running: dict[str, asyncio.Future[Any]] = {}
        self._start = start  # the supervisor's, which keeps `listen` running once started
        self._subscribed: asyncio.Event | None = None

    async def ready(self) -> None:
        """Subscribed to other replicas' cancellations (with Redis), started on first use; a
        subscription Redis is slow to confirm is not waited for past a second."""
        if self.redis is None:
            return
        if self._subscribed is None:
            self._subscribed = asyncio.Event()
            self._start("mcp_cancellations", self.listen)
        if not self._subscribed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), SUBSCRIBING)

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
            if self._subscribed is not None:
                self._subscribed.set()
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
