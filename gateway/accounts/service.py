"""What the request path asks of accounts, and the listener that charges each request.

`Accounts` is built once per process (`gateway.app.lifespan`): it opens the database, moves its
schema forward, reads the directory, and runs one supervised task that polls the revision,
writes the spend buffer in batches and prunes old spend. The request path never waits on the
database: the directory (`find`) is memory, and the budgets' holds and the parallel limits'
counts are in the ledger (`reserve`): this process's memory, or the one every process shares
(Redis, or the machine's file) when there is one. Each request's record, when it ends, gives
its holds back and adds a spend row to the buffer (`ended`); a database that is down leaves the
rows buffered (bounded) until it is back.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.accounts import pricing
from gateway.accounts.account import NANO, Account, Scope, Slots, nano
from gateway.accounts.database import Database, SchemaTooNew
from gateway.accounts.directory import Directory
from gateway.accounts.ledger import (
    Counted,
    Hold,
    Ledger,
    LedgerUnavailable,
    LocalLedger,
    Over,
)
from gateway.accounts.spend import SpendRow, utc_day
from gateway.core.errors import (
    AuthenticationFailed,
    BudgetExceeded,
    DatabaseUnavailable,
    KeyRateLimited,
    ModelNotAllowed,
)
from gateway.core.record import Record
from gateway.core.settings import DatabaseConfig, Route
from providers.contract.log import get_logger
from providers.contract.usage import Price

PRUNE_EVERY = 3600.0
UNAUTHENTICATED = 401
BATCH = 5_000  # spend rows per insert
NO_TOKENS = (0, 0, 0)
ALIAS, PROVIDER = SpendRow._fields.index("alias"), SpendRow._fields.index("provider")


@dataclass(slots=True)
class Charge:
    """What accounts hold for one request: its account, its parallel slot, its budget hold."""

    account: Account
    parallel: bool = False  # its slots are counted in this process
    slots: Hold | None = None  # ... or held in the shared ledger
    hold: Hold | None = None
    shared: bool = False  # the hold is in the shared ledger (Redis, or the machine's file)
    prompt: int = 0  # prompt tokens estimated, for a stream cut before its usage


class Accounts:
    """Keys, budgets and spend for one process."""

    def __init__(self, db: Database, settings: DatabaseConfig,
                 price_of: Callable[[str, str], Price | None],
                 route_of: Callable[[str, str], Route | None],
                 shared: Ledger | None = None,
                 clock: Callable[[], float] = time.time, alone: bool = True) -> None:
        self.db = db
        self.settings = settings
        self.price_of = price_of  # (provider, alias) -> its price
        self.route_of = route_of  # (alias, provider) -> the route that served
        self.shared = shared
        self.clock = clock
        self.directory = Directory()
        # No other process reads this database (one worker, its own SQLite file, no Redis):
        # its own admin routes are the only way a key appears while it serves.
        self.alone = alone
        self.local = LocalLedger(clock)
        self.parallel: Counter[str] = Counter()
        # Slots held in the shared ledger by requests still running, by hold id: their lease
        # is renewed until they end (`lease`).
        self.leased: dict[str, Hold] = {}
        self.buffer: deque[tuple[Any, ...]] = deque()  # spend rows, but their upstream model
        self.dropped = 0  # spend rows lost to a full buffer while the database was down
        self.up: bool | None = None  # None until the database first answered or failed
        self.error: str | None = None
        self.migrated = False
        self._pruned = 0.0
        self._day, self._day_ends = "", 0.0

    # --- start and the background task -----------------------------------------------------

    async def start(self) -> None:
        """Migrate and read the directory; a database that is down is retried by `run`
        (SchemaTooNew is raised: that gateway must not start)."""
        try:
            await self._ready()
        except DatabaseUnavailable as exc:
            self._mark(False, exc)

    async def _ready(self) -> None:
        if not self.migrated:
            try:
                await self.db.migrate()
            except SchemaTooNew:
                raise
            except Exception as exc:  # a database that cannot be reached, in any driver's words
                raise DatabaseUnavailable(f"cannot migrate: {type(exc).__name__}") from exc
            self.migrated = True
        await self.directory.refresh(self.db, self.clock())
        self._mark(True)

    async def run(self) -> None:
        """Forever: the directory kept fresh, spend written, old spend pruned."""
        flushed = 0.0
        while True:
            await asyncio.sleep(self.settings.poll_interval)
            try:
                await self._ready()
                if self.clock() - flushed >= self.settings.flush_interval:
                    flushed = self.clock()
                    await self.flush()
                await self._prune()
            except DatabaseUnavailable as exc:
                self._mark(False, exc)

    async def lease(self) -> None:
        """Forever: the parallel slots of the requests still running renewed in the shared
        ledger, a third of their lease apart, so only a process that stopped loses them."""
        lease = self.settings.parallel_lease
        while True:
            await asyncio.sleep(lease / 3)
            if self.shared is None or not self.leased:
                continue
            try:
                await self.shared.renew(list(self.leased.values()), self.clock(), lease)
            except LedgerUnavailable as exc:
                get_logger().warning("parallel_lease_unrenewed", error=str(exc))

    async def flush(self) -> None:
        """Write the buffered spend rows; on failure they stay, in order."""
        while self.buffer:
            batch = [self.buffer.popleft() for _ in range(min(BATCH, len(self.buffer)))]
            try:
                await self.db.write_spend(self._with_models(batch))
            except BaseException:
                self.buffer.extendleft(reversed(batch))
                raise

    async def _prune(self) -> None:
        now = self.clock()
        if now - self._pruned >= PRUNE_EVERY:
            self._pruned = now
            await self.db.prune_spend(now - self.settings.retention_days * 86400)

    async def close(self) -> None:
        """Write what is buffered (if the database answers), then close it."""
        try:
            await self.flush()
        except DatabaseUnavailable as exc:
            get_logger().warning("spend_unwritten", rows=len(self.buffer), error=str(exc))
        await self.db.close()

    async def audit(self, actor: str, action: str, target: str,
                    change: Mapping[str, Any] | None = None) -> None:
        """An admin action besides keys and teams, written if the database answers (the action
        itself never waits for it to)."""
        try:
            await self.db.audited(actor, action, target, change)
        except DatabaseUnavailable as exc:
            get_logger().warning("audit_unwritten", action=action, target=target,
                                 error=str(exc))

    def _mark(self, up: bool, error: BaseException | None = None) -> None:
        self.error = None if up else str(error)
        if up != self.up:
            log = get_logger()
            if up:
                log.info("accounts_database_connected")
            else:
                log.warning("accounts_database_unavailable", error=self.error,
                            action="serving known keys; spend buffered")
        self.up = up

    # --- the request path ------------------------------------------------------------------

    @property
    def keys_required(self) -> bool:
        """Whether relay requests need a key: a virtual key was made, or the directory was
        never read (a database down at start must not open the gateway)."""
        known = self.directory.known
        return known.ever or known.revision < 0

    async def keyless(self) -> bool:
        """Whether a request without a key may still be served: no key was ever made, as the
        database says now when another worker or replica may have made the first one (their
        admin answer returned, so none of their key's requests may go uncharged here)."""
        if self.keys_required:
            return False
        if not self.alone:
            try:
                await self.directory.fresh(self.db, self.clock())
            except DatabaseUnavailable as exc:  # the last directory serves, as for keys
                self._mark(False, exc)
        return not self.keys_required

    def find(self, secret: str) -> Account | None:
        return self.directory.find(secret)

    def unexpired(self, account: Account) -> Account:
        """`account`, unless it has expired (401): every route that acts for a key asks."""
        if account.expires_at is not None and account.expires_at <= self.clock():
            raise AuthenticationFailed("This API key has expired")
        return account

    def check(self, account: Account, record: Record) -> None:
        """An expired key is refused; a key at its parallel limit (or its team's) too, here
        when this process alone counts them (else in `reserve`, against the shared ledger)."""
        self.unexpired(account)
        charge = Charge(account)
        record.charge, record.team = charge, account.team
        if account.slots and self.shared is None:
            self._count_here(charge)

    def _count_here(self, charge: Charge) -> None:
        slots = charge.account.slots
        for slot in slots:
            if self.parallel[slot.id] >= slot.limit:
                raise KeyRateLimited(_busy(slot), retry_after=1.0)
        for slot in slots:
            self.parallel[slot.id] += 1
        charge.parallel = True

    def check_model(self, account: Account, alias: str | None, asked: str) -> None:
        """403 for an alias the key may not use; the same for a name that is no alias, so
        a restricted key cannot learn which exist."""
        if account.models is not None and (alias is None or not account.allows(alias)):
            raise ModelNotAllowed(f"This key may not use the model '{asked[:200]}'",
                                  param="model")

    async def reserve(self, record: Record, need: pricing.Need,
                      reach: Iterable[tuple[str, Route]],
                      prices: Mapping[tuple[str, str], Price]) -> None:
        """Hold the worst case of `need` served by any of `reach` ((alias, route) pairs) against
        the request's budgets; 429 budget_exceeded when one cannot take it."""
        charge = record.charge
        if not isinstance(charge, Charge):
            return
        if charge.account.slots and self.shared is not None:
            await self._hold_slots(charge)
        if not charge.account.scopes or record.endpoint == "messages/count_tokens":
            return
        amount = pricing.worst_case(record.endpoint, need, reach, prices)
        charge.prompt = need.prompt
        await self._hold(charge, amount)
        assert charge.hold is not None
        record.mark("x-llms-budget-remaining", f"{max(charge.hold.remaining, 0.0):.6f}")

    async def hold(self, account: Account, amount: int) -> Charge:
        """`amount` nano-dollars held against the account's budgets for what is not one
        request (a batch an upstream runs), settled by `ended` with a record that carries it;
        429 budget_exceeded when one budget cannot take it."""
        charge = Charge(account)
        if account.scopes:
            await self._hold(charge, amount)
        return charge

    def release(self, charge: Charge) -> None:
        """A `hold` given back whole: what it was for never ran."""
        if charge.hold is not None:
            ledger = self.shared if charge.shared and self.shared is not None else self.local
            ledger.settle(charge.hold, 0)

    async def _hold(self, charge: Charge, amount: int) -> None:
        now = self.clock()
        held: Hold | Over | None = None
        if self.shared is not None:
            try:
                held = await self.shared.reserve(charge.account.scopes, amount,
                                                 self.directory.spent, now)
                charge.shared = True
            except LedgerUnavailable as exc:  # this process's ledger, meanwhile
                get_logger().warning("budget_ledger_unavailable", error=str(exc))
        if held is None:
            held = self.local.reserve(charge.account.scopes, amount, self.directory.spent, now)
        if isinstance(held, Over):
            raise BudgetExceeded(_over(held, amount),
                                 held.resets_at - now if held.resets_at else None)
        charge.hold = held

    async def _hold_slots(self, charge: Charge) -> None:
        """A unit of each of the key's (and team's) parallel limits, in the ledger every
        process shares; counted here while it cannot answer."""
        assert self.shared is not None
        try:
            held = await self.shared.reserve(charge.account.slots, 1, _none_before,
                                             self.clock(), self.settings.parallel_lease)
        except LedgerUnavailable as exc:
            get_logger().warning("budget_ledger_unavailable", error=str(exc))
            self._count_here(charge)
            return
        if isinstance(held, Over):
            raise KeyRateLimited(_busy(held.scope), retry_after=1.0)
        charge.slots = held
        self.leased[held.id] = held

    def ended(self, record: Record) -> None:
        """The record's listener: release its slot, settle its hold, buffer its spend row."""
        charge = record.charge if isinstance(record.charge, Charge) else None
        cost = self.cost(record)
        if charge is not None:
            account = charge.account
            if charge.parallel:
                for slot in account.slots:
                    self.parallel[slot.id] -= 1
            if charge.slots is not None and self.shared is not None:
                self.leased.pop(charge.slots.id, None)
                self.shared.settle(charge.slots, 0)
            if charge.hold is not None:
                ledger = self.shared if charge.shared and self.shared is not None \
                    else self.local
                ledger.settle(charge.hold, nano(cost or 0.0))
        self._row(record, cost)

    def cost(self, record: Record) -> float | None:
        """What the request that ended is charged (`pricing.charged`)."""
        charge = record.charge
        prompt = charge.prompt if isinstance(charge, Charge) else 0
        return pricing.charged(record, prompt, self.price_of)

    def _row(self, record: Record, cost: float | None) -> None:
        if record.status == UNAUTHENTICATED:  # nobody's spend: a flood of them fills no table
            return
        buffer = self.buffer
        if len(buffer) >= self.settings.max_buffered_rows:
            buffer.popleft()
            self.dropped += 1
        now = time.time()
        if now >= self._day_ends:  # the UTC date, worked out once a day
            self._day, self._day_ends = utc_day(now), (now // 86400 + 1) * 86400
        usage = record.usage
        # A plain tuple in `SpendRow`'s order but its last field, the upstream model: that one
        # is looked up when the row is written, off the request's path.
        buffer.append((
            now, self._day, record.request_id, record.key_id, record.team,
            record.alias if record.known_model else None, record.provider, record.endpoint,
            *((usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
              if usage is not None else NO_TOKENS),
            cost or 0.0, record.duration * 1000, record.status))

    def _with_models(self, batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Each row ended by the upstream model that served it (one lookup per alias and
        provider)."""
        found: dict[tuple[str | None, str | None], str | None] = {}
        rows = []
        for row in batch:
            alias, provider = served = row[ALIAS], row[PROVIDER]
            if served not in found:
                route = self.route_of(alias, provider) \
                    if alias is not None and provider is not None else None
                found[served] = route.upstream_model if route is not None else None
            rows.append((*row, found[served]))
        return rows

    def status(self) -> dict[str, Any]:
        """What `/status.json` says of the database."""
        return {"up": bool(self.up), "error": self.error, "buffered": len(self.buffer),
                "dropped": self.dropped, "keys": len(self.directory.known.by_id),
                "teams": len(self.directory.known.teams)}


def _none_before(scope_id: str, start: float) -> float:
    """What a count of requests in flight starts from: nothing (the database keeps none)."""
    return 0.0


def _busy(slots: Counted) -> str:
    assert isinstance(slots, Slots)
    return (f"{slots.kind.capitalize()} {slots.name} has {slots.limit} requests in flight, "
            "its most")


def _over(over: Over, amount: int) -> str:
    scope = over.scope
    assert isinstance(scope, Scope)
    resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(over.resets_at)) \
        if over.resets_at is not None else "never (a total budget)"
    return (f"Budget exceeded for {scope.kind} '{scope.name}': ${over.spent:.6f} of its "
            f"${scope.budget.usd:.6f} per {scope.budget.period} is spent or held, and this "
            f"request may cost up to ${amount / NANO:.6f}; it resets {resets}")
