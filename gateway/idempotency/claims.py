"""Which replica runs a keyed request: a claim in Redis, so a retry on another replica waits for
the first's answer instead of running (and billing) the request again.

The replica that starts a flight claims its key (`SET NX`) for a short lease
(`idempotency.lease`) and renews it while the flight runs; the claim names the body's hash and
whether the answer can still be remembered. A retry that reaches another replica finds the claim
and waits: for the answer in the store (then replayed), or for the claim to go without one (the
first failed, or its process died and the lease ran out: then the retry claims it and runs). A
retry with another body is a 422 there too; one whose first answer grew past what is remembered
is a 409, as it is on the replica running it. Without Redis, or while Redis cannot answer, every
claim is this process's own: the request runs here, as it would have (a miss, never a failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.core.redis_errors import redis_trouble

if TYPE_CHECKING:
    from redis.asyncio import Redis

# KEYS: the claim. ARGV: its token, the value it is renewed with, its lease in ms. Only the
# holder's token renews it.
RENEW = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""
# KEYS: the claim. ARGV: its token. Only the holder lets it go.
RELEASE = """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, #ARGV[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# The longest pause between two looks of a replica waiting for another's answer.
MAX_PAUSE = 0.25


@dataclass(frozen=True, slots=True)
class Claim:
    """This process runs the key's request (`token` empty: no other replica is told)."""

    key: str
    token: str = ""


@dataclass(frozen=True, slots=True)
class Elsewhere:
    """Another replica runs the key's request: its body's hash, and whether its answer can
    still be remembered (else no retry can be given it)."""

    digest: str
    joinable: bool


class Claims:
    """The claims of keyed requests, in Redis under `prefix` when there is a client."""

    def __init__(self, redis: Redis | None = None, prefix: str = "",
                 lease: float = 10.0) -> None:
        self.redis = redis
        self.prefix = f"{prefix}idempotency-claim:"
        self.lease = lease
        self.trouble = redis_trouble() if redis is not None else ()
        self._renew = redis.register_script(RENEW) if redis is not None else None
        self._release = redis.register_script(RELEASE) if redis is not None else None

    async def take(self, key: str, digest: str) -> Claim | Elsewhere:
        """The key's claim for this process, or who holds it."""
        if self.redis is None:
            return Claim(key)
        token = os.urandom(8).hex()
        try:
            if await self.redis.set(self.prefix + key, _value(token, digest, True), nx=True,
                                    px=self._ms):
                return Claim(key, token)
            held = await self.redis.get(self.prefix + key)
        except self.trouble:
            return Claim(key)
        if held is None:  # let go meanwhile
            return await self.take(key, digest)
        return _read(held) or Claim(key)  # a value this gateway never writes: nobody's claim

    async def keep(self, claim: Claim, digest: str, joinable: Callable[[], bool]) -> None:
        """Forever (cancelled when the flight ends): the claim renewed a third of its lease
        apart, saying whether the answer can still be remembered."""
        if self._renew is None or not claim.token:
            return
        while True:
            await asyncio.sleep(self.lease / 3)
            with contextlib.suppress(*self.trouble):
                await self._renew(keys=[self.prefix + claim.key],
                                  args=[claim.token, _value(claim.token, digest, joinable()),
                                        self._ms])

    async def release(self, claim: Claim) -> None:
        """Let the claim go (once the answer, if any, is stored): a waiting replica reads it,
        or runs the request itself."""
        if self._release is None or not claim.token:
            return
        with contextlib.suppress(*self.trouble):
            await self._release(keys=[self.prefix + claim.key], args=[claim.token])

    @property
    def _ms(self) -> int:
        return max(1, int(self.lease * 1000))


def _value(token: str, digest: str, joinable: bool) -> str:
    return f"{token} {digest} {int(joinable)}"


def _read(held: object) -> Elsewhere | None:
    """A claim's value as another replica wrote it; None for none, or one this gateway never
    writes (Redis is shared: it is nobody's claim)."""
    if not isinstance(held, bytes):
        return None
    parts = held.decode("ascii", "replace").split(" ")
    if len(parts) != 3 or parts[2] not in ("0", "1"):
        return None
    return Elsewhere(parts[1], parts[2] == "1")


async def pause(waited: float) -> float:
    """Sleep before the next look at another replica's answer; the pause after this one."""
    await asyncio.sleep(waited)
    return min(waited * 2, MAX_PAUSE)
