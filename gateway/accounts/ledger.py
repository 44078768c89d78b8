"""Budgets by reservation: what each budget has spent and holds reserved, per period.

A request reserves its worst-case cost against every budget it falls under, all or none, before
it is sent; when it ends its hold is settled: the real cost is added to the spent, the hold
released. Concurrent requests can therefore never together pass a budget: each sees what the
others hold. `LocalLedger` keeps the counts in this process (one worker); `FileLedger` in a
SQLite file the workers of one machine share; `RedisLedger` in Redis, reserved by one script,
so every worker and replica shares them. A hold carries a
deadline: one whose request never settled (its process died) is released by the next reservation
that looks at its budget. A parallel slot's deadline is a short lease (`database.parallel_lease`)
its process renews while the request runs (`renew`), so a killed process's slots are free again
within about the lease, not the hour a budget's hold may wait.

Amounts are integer nano-dollars. The spent a budget starts a period with is what the database
knew when the ledger first saw the period (`known`); from then on the ledger is the count.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gateway.accounts.account import NANO, Period, window
from gateway.core.redis_errors import redis_trouble
from providers.contract.log import get_logger

if TYPE_CHECKING:
    from redis.asyncio import Redis

# How long a hold may stay unsettled before another reservation releases it: longer than any
# request lives (a provider's total timeout is 10 minutes by default, a queue wait one).
HOLD_TTL = 3600.0
Known = Callable[[str, float], float]  # dollars the database says a scope spent since a start


class Counted(Protocol):
    """What a ledger counts against: a budget (`Scope`, nano-dollars) or requests in flight
    (`Slots`, one unit each)."""

    @property
    def id(self) -> str: ...
    @property
    def limit(self) -> int: ...
    @property
    def period(self) -> Period: ...


@dataclass(frozen=True, slots=True)
class Over:
    """The budget a reservation did not fit in."""

    scope: Counted
    spent: float  # dollars (units, for slots) spent and held in the period
    resets_at: float | None


@dataclass(slots=True)
class Hold:
    """One request's reservation: which budgets, how much, and what is left after it."""

    id: str
    entries: tuple[tuple[str, float], ...]  # (scope id, period start)
    amount: int
    remaining: float  # dollars left in the tightest budget, this hold counted
    settled: bool = False


class LedgerUnavailable(Exception):
    """A shared ledger could not answer (Redis away, the machine's file locked or broken)."""


class Ledger(Protocol):
    """Where budgets are counted that several processes share (Redis, the machine's file)."""

    async def reserve(self, scopes: Sequence[Counted], amount: int, known: Known,
                      now: float, ttl: float = HOLD_TTL) -> Hold | Over:
        """Hold `amount` against every scope, or none, until `now + ttl` at least unless
        renewed; LedgerUnavailable when it cannot answer."""
        ...

    async def renew(self, holds: Sequence[Hold], now: float, ttl: float) -> None:
        """Move the deadline of each hold still held to `now + ttl` at least;
        LedgerUnavailable when it cannot answer."""
        ...

    def settle(self, hold: Hold, cost: int) -> None: ...


def expiry(now: float, ttl: float) -> int:
    """A hold's deadline in whole seconds, never before `now + ttl` (ledgers compare it with
    the whole second a reservation is made in)."""
    return int(now + ttl) + 1


class Windows:
    """Each period's current window, worked out again only once it ended (the calendar's
    arithmetic is the dearest part of a reservation otherwise)."""

    def __init__(self) -> None:
        self.current: dict[str, tuple[float, float | None]] = {}

    def of(self, period: Period, now: float) -> tuple[float, float | None]:
        found = self.current.get(period)
        if found is None or (found[1] is not None and now >= found[1]) or now < found[0]:
            found = self.current[period] = window(period, now)
        return found

    def entries(self, scopes: Sequence[Counted], now: float
                ) -> list[tuple[Counted, float, float | None]]:
        return [(scope, *self.of(scope.period, now)) for scope in scopes]


def new_id() -> str:
    return os.urandom(8).hex()


@dataclass(slots=True)
class _Count:
    spent: int
    held: dict[str, tuple[int, float]] = field(default_factory=dict)  # id: (amount, deadline)
    reserved: int = 0


class LocalLedger:
    """Budgets counted in this process. Its `reserve` is not a coroutine: it never waits."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.counts: dict[tuple[str, float], _Count] = {}
        self.windows = Windows()
        self._ids = itertools.count()  # a hold's id need only be unique in this process

    def reserve(self, scopes: Sequence[Counted], amount: int, known: Known,
                now: float) -> Hold | Over:
        """Hold `amount` against every scope, or none of them."""
        entries, counts, remaining = [], [], None
        for scope in scopes:
            start, end = self.windows.of(scope.period, now)
            entry = (scope.id, start)
            count = self.counts.get(entry)
            if count is None:
                count = self.counts[entry] = _Count(round(known(scope.id, start) * NANO))
            left = scope.limit - count.spent - count.reserved - amount
            if left < 0:  # holds past their deadline are looked for only when they would refuse
                _expire(count, now)
                left = scope.limit - count.spent - count.reserved - amount
                if left < 0:
                    return Over(scope, (count.spent + count.reserved) / NANO, end)
            entries.append(entry)
            counts.append(count)
            if remaining is None or left < remaining:
                remaining = left
        hold = Hold(str(next(self._ids)), tuple(entries), amount, (remaining or 0) / NANO)
        held = (amount, now + HOLD_TTL)
        for count in counts:
            count.held[hold.id] = held
            count.reserved += amount
        self._forget_before(now)
        return hold

    def settle(self, hold: Hold, cost: int) -> None:
        """The request's real cost spent; its hold released."""
        if hold.settled:
            return
        hold.settled = True
        for entry in hold.entries:
            count = self.counts.get(entry)
            if count is None:
                continue
            held = count.held.pop(hold.id, None)
            if held is not None:
                count.reserved -= held[0]
            count.spent += cost

    def _forget_before(self, now: float) -> None:
        if len(self.counts) > 10_000:  # bounded: periods that ended can no longer matter
            today = window("day", now)[0]
            for entry in [e for e in self.counts if 0 < e[1] < today - 32 * 86400]:
                del self.counts[entry]


def _expire(count: _Count, now: float) -> None:
    """Release the holds past their deadline."""
    for hold_id in [h for h, (_, deadline) in count.held.items() if deadline <= now]:
        count.reserved -= count.held.pop(hold_id)[0]


# KEYS: one hash per (scope, period). ARGV: now, amount, hold id, hold deadline, then per key
# its limit, the spent the database knew, and when the hash may expire (0: never). Holds live in
# the hash as `h:<id>` = "amount:deadline"; expired ones are released first.
RESERVE = """
local now = tonumber(ARGV[1])
local amount = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local base = 4 + (i - 1) * 3
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'spent', ARGV[base + 2], 'reserved', 0)
    if tonumber(ARGV[base + 3]) > 0 then redis.call('EXPIREAT', key, ARGV[base + 3]) end
  end
  local fields = redis.call('HGETALL', key)
  for j = 1, #fields, 2 do
    local name = fields[j]
    if string.sub(name, 1, 2) == 'h:' then
      local held, deadline = string.match(fields[j + 1], '^(%d+):(%d+)$')
      if deadline == nil or tonumber(deadline) <= now then
        redis.call('HDEL', key, name)
        redis.call('HINCRBY', key, 'reserved', -(tonumber(held) or 0))
      end
    end
  end
  local spent = tonumber(redis.call('HGET', key, 'spent'))
  local reserved = tonumber(redis.call('HGET', key, 'reserved'))
  if spent + reserved + amount > tonumber(ARGV[base + 1]) then
    return {i, tostring(spent + reserved)}
  end
end
local remaining = nil
for i, key in ipairs(KEYS) do
  local base = 4 + (i - 1) * 3
  redis.call('HINCRBY', key, 'reserved', amount)
  redis.call('HSET', key, 'h:' .. ARGV[3], ARGV[2] .. ':' .. ARGV[4])
  local left = tonumber(ARGV[base + 1]) - tonumber(redis.call('HGET', key, 'spent'))
               - tonumber(redis.call('HGET', key, 'reserved'))
  if remaining == nil or left < remaining then remaining = left end
end
return {0, tostring(remaining or 0)}
"""

# KEYS: the hold's hashes. ARGV: hold id, cost. A hold already released still spends.
SETTLE = """
for _, key in ipairs(KEYS) do
  local held = redis.call('HGET', key, 'h:' .. ARGV[1])
  if held then
    redis.call('HDEL', key, 'h:' .. ARGV[1])
    redis.call('HINCRBY', key, 'reserved', -tonumber(string.match(held, '^(%d+)')))
  end
  if redis.call('EXISTS', key) == 1 then redis.call('HINCRBY', key, 'spent', ARGV[2]) end
end
return 0
"""
# KEYS: the hashes of the holds renewed. ARGV: the new deadline, then per key the hold's id. A
# hold already released (settled, or expired and taken by another reservation) stays so.
RENEW = """
for i, key in ipairs(KEYS) do
  local name = 'h:' .. ARGV[i + 1]
  local held = redis.call('HGET', key, name)
  if held then
    redis.call('HSET', key, name, string.match(held, '^(%d+)') .. ':' .. ARGV[1])
  end
end
return 0
"""
# How long a period's counts outlive the period in Redis (late settlements still land).
AFTER_PERIOD = 7 * 86400


class RedisLedger:
    """Budgets counted in Redis, shared by every worker and replica; settlements are sent in
    the background, in batches (until one lands the budget only looks fuller)."""

    def __init__(self, client: Redis, prefix: str) -> None:
        self.client = client
        self.trouble = redis_trouble()
        self.prefix = prefix
        self._reserve = client.register_script(RESERVE)
        self._settle = client.register_script(SETTLE)
        self._renew = client.register_script(RENEW)
        self.pending: deque[tuple[Hold, int]] = deque(maxlen=100_000)
        self.wake = asyncio.Event()
        self.windows = Windows()

    def _key(self, entry: tuple[str, float]) -> str:
        return f"{self.prefix}budget:{entry[0]}:{int(entry[1])}"

    async def reserve(self, scopes: Sequence[Counted], amount: int, known: Known,
                      now: float, ttl: float = HOLD_TTL) -> Hold | Over:
        """One script: every scope's expired holds released, all checked, all held or none."""
        entries = self.windows.entries(scopes, now)
        hold_id = new_id()
        argv: list[str | int] = [int(now), amount, hold_id, expiry(now, ttl)]
        for scope, start, end in entries:
            argv += [scope.limit, round(known(scope.id, start) * NANO),
                     int(end + AFTER_PERIOD) if end is not None else 0]
        keys = [self._key((scope.id, start)) for scope, start, _ in entries]
        try:
            index, value = await self._reserve(keys=keys, args=argv)
        except self.trouble as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc
        if int(index) > 0:
            scope, _, end = entries[int(index) - 1]
            return Over(scope, int(value) / NANO, end)
        return Hold(hold_id, tuple((scope.id, start) for scope, start, _ in entries), amount,
                    int(value) / NANO)

    async def renew(self, holds: Sequence[Hold], now: float, ttl: float) -> None:
        """One script for every hold's every budget."""
        entries = [(self._key(entry), hold.id) for hold in holds for entry in hold.entries]
        if not entries:
            return
        try:
            await self._renew(keys=[key for key, _ in entries],
                              args=[expiry(now, ttl), *(hold_id for _, hold_id in entries)])
        except self.trouble as exc:
            raise LedgerUnavailable(type(exc).__name__) from exc

    def settle(self, hold: Hold, cost: int) -> None:
        if not hold.settled:
            hold.settled = True
            self.pending.append((hold, cost))
            self.wake.set()

    async def run(self) -> None:
        """Send settlements as they come; a Redis failure keeps them for the next try."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            if not await self.flush():
                await asyncio.sleep(0.5)
                self.wake.set()

    async def flush(self) -> bool:
        """Send what is pending; whether all of it went."""
        while self.pending:
            hold, cost = self.pending[0]
            try:
                await self._settle(keys=[self._key(e) for e in hold.entries],
                                   args=[hold.id, cost])
            except self.trouble as exc:
                get_logger().warning("budget_settle_failed", error=type(exc).__name__)
                return False
            self.pending.popleft()
        return True


