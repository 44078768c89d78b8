"""The accounts' stages: who a call runs as (`keys`), and what it may cost (`budget`).

`keys` comes first on every relay endpoint: the key presented (or given by whoever runs the
call, a batch's owner), a virtual key's expiry and parallel limit, and the per-minute limits of
the key and its team, all before the body is read. `budget` comes after admission, once the
alias and its candidates are known: the request's worst case is held against every budget it
falls under before it waits or reaches a provider (settled when its record ends,
`Accounts.ended`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.accounts import auth
from gateway.accounts.account import Account
from gateway.accounts.service import Accounts
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.errors import KeyRateLimited
from gateway.core.limits import KeyLimits, RateLimiter
from gateway.core.settings import Snapshot
from providers.contract.usage import Price


def keys(snapshot: Snapshot, accounts: Accounts | None, limiter: RateLimiter) -> Stage:
    """The stage that finds the call's key and checks its limits."""

    async def stage(call: Call, following: Next) -> Delivery:
        key = call.key if call.caller else auth.identify(call.headers, snapshot, accounts)
        call.key = key
        if key is not None:
            call.record.key_id = key.limits.key_id
            account = key if isinstance(key, Account) else None
            if account is not None and accounts is not None:
                accounts.check(account, call.record)
            _rate_limited(limiter, key.limits)
            if account is not None and account.team_limits is not None:
                _rate_limited(limiter, account.team_limits)
        return await following(call)

    return stage


def budget(accounts: Accounts, prices: Mapping[tuple[str, str], Price]) -> Stage:
    """The stage that holds a virtual key's worst case against its budgets."""

    async def stage(call: Call, following: Next) -> Delivery:
        if isinstance(call.key, Account):
            await accounts.reserve(call.record, call.raw, call.alias, call.routes, prices)
        return await following(call)

    return stage


def _rate_limited(limiter: RateLimiter, limits: KeyLimits) -> None:
    if (wait := limiter.admit(limits)) is not None:
        raise KeyRateLimited(f"Rate limit reached for key {limits.key_id}; "
                             f"retry in {wait:.0f}s", retry_after=wait)
