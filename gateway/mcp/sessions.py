"""Old-revision (2025-11-25) sessions: `initialize` opens one, `DELETE` ends it, and any replica
serves it. With Redis, a session is one key there (its id, the key that opened it, its protocol
version), renewed on each use; without, this process's memory holds them, bounded. Nothing
else is kept: every request of a session carries what it needs, so no replica is sticky.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from gateway.core.redis_errors import redis_trouble

if TYPE_CHECKING:
    from redis.asyncio import Redis

MAX_ID = 128  # a longer `Mcp-Session-Id` is none of ours: not looked up


class SessionsUnavailable(Exception):
    """Redis cannot say whether a session exists."""


@dataclass(frozen=True, slots=True)
class Session:
    """One client's session, as its requests are served."""

    id: str
    key_id: str | None  # the key that opened it; only that key may use it
    version: str  # the protocol revision `initialize` agreed


class _Stored(msgspec.Struct, array_like=True):
    key_id: str | None
    version: str


class Sessions:
    """Where sessions live: Redis when the gateway has it, else this process."""

    def __init__(self, redis: Redis | None, prefix: str, max_sessions: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = redis
        self.prefix = f"{prefix}mcp:session:"
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.clock = clock
        self._here: OrderedDict[str, tuple[_Stored, float]] = OrderedDict()
        self._trouble = redis_trouble() if redis is not None else ()

    async def open(self, key_id: str | None, version: str) -> Session:
        """A new session for `key_id`, agreed on `version`."""
        session = Session(secrets.token_urlsafe(24), key_id, version)
        stored = msgspec.json.encode(_Stored(key_id, version))
        if self.redis is not None:
            try:
                await self.redis.set(self.prefix + session.id, stored, ex=int(self.ttl))
            except self._trouble as exc:
                raise SessionsUnavailable(str(exc)) from exc
            return session
        here = self._here
        here[session.id] = (_Stored(key_id, version), self.clock() + self.ttl)
        while len(here) > self.max_sessions:  # the least recently used goes first
            here.popitem(last=False)
        return session

    async def find(self, session_id: str) -> Session | None:
        """The live session `session_id`, its life renewed; None when it ended or never was."""
        if not session_id or len(session_id) > MAX_ID or not session_id.isprintable():
            return None
        if self.redis is not None:
            try:
                raw = await self.redis.getex(self.prefix + session_id, ex=int(self.ttl))
            except self._trouble as exc:
                raise SessionsUnavailable(str(exc)) from exc
            if raw is None:
                return None
            stored = msgspec.json.decode(raw, type=_Stored)
            return Session(session_id, stored.key_id, stored.version)
        found = self._here.get(session_id)
        now = self.clock()
        if found is None or found[1] <= now:
            self._here.pop(session_id, None)
            return None
        self._here[session_id] = (found[0], now + self.ttl)
        self._here.move_to_end(session_id)
        return Session(session_id, found[0].key_id, found[0].version)

    async def end(self, session_id: str) -> None:
        """The session is over: its later requests are 404s, on every replica."""
        if self.redis is not None:
            try:
                await self.redis.delete(self.prefix + session_id)
            except self._trouble as exc:
                raise SessionsUnavailable(str(exc)) from exc
            return
        self._here.pop(session_id, None)
