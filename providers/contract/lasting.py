"""Resources that outlive config snapshots: a worker pool's processes, kept across reloads.

Providers are rebuilt for every snapshot (a reload, an admin switch, a discovery change), but a
model that took minutes to load must not be restarted because someone reordered providers.
A provider acquires its lasting resource by key with a fingerprint of the config it depends on:
the same fingerprint gets the running one back, a different one closes the old and builds anew.
The last release closes it. The Services owns one `Lasting` and closes what is left at shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast


class Closable(Protocol):
    async def close(self) -> None: ...


R = TypeVar("R", bound=Closable)


@dataclass(slots=True)
class _Held:
    fingerprint: str
    resource: Closable
    users: int


class Lasting:
    """Keyed, reference-counted long-lived resources."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        # Overlapping applies (a reload, discovery, an admin switch) must not both build a pool.
        self._lock = asyncio.Lock()

    async def acquire(self, key: str, fingerprint: str,
                      build: Callable[[], Awaitable[R]]) -> R:
        """The resource under `key` built for `fingerprint`, building it if needed."""
        async with self._lock:
            return await self._acquire(key, fingerprint, build)

    async def _acquire(self, key: str, fingerprint: str,
                       build: Callable[[], Awaitable[R]]) -> R:
        held = self._held.get(key)
        if held is not None and held.fingerprint == fingerprint:
            held.users += 1
            return cast(R, held.resource)
        if held is not None:
            # Its config changed: the old one goes first (it may hold the GPUs the new one needs).
            del self._held[key]
            await held.resource.close()
        resource = await build()
        self._held[key] = _Held(fingerprint, resource, 1)
        return resource

    async def release(self, key: str, resource: object) -> None:
        """One user is done with it; the last one closes it."""
        async with self._lock:
            await self._release(key, resource)

    async def _release(self, key: str, resource: object) -> None:
        held = self._held.get(key)
        if held is None or held.resource is not resource:
            return  # already replaced by a newer config, and closed then
        held.users -= 1
        if held.users <= 0:
            del self._held[key]
            await held.resource.close()

    async def close(self) -> None:
        """Close everything still held (gateway shutdown)."""
        held, self._held = list(self._held.values()), {}
        for item in held:
            await item.resource.close()
