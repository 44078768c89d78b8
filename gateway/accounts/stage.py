"""The accounts' stages: who a call runs as (`keys`), and what it may cost (`budget`).

`keys` comes first on every relay endpoint: the key presented (or given by whoever runs the
call, a batch's owner), or none while no key was ever made (`auth.admitted`), a virtual key's
expiry and parallel limit, and the per-minute limits of the key and its team, all before the
body is read (what the tightest of those leave is told in the answer's `x-ratelimit-*`
headers). `budget` comes after admission, once the alias and its candidates are known (and a
Responses turn's stored conversation, `previous`): the request's worst case, over every
candidate it may reach (its fallbacks' too, those its key may use), is held against every
budget it falls under before it waits or reaches a provider (settled when its record ends,
`Accounts.ended`). A budgeted key never reaches a model without a price: asked for, it is
refused (`ModelUnpriced`); as a fallback, it is passed over. `finishing` comes last, around
the relay: a whole request held against a budget is read to its end when its client leaves, so
it is charged what its provider bills.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from gateway.accounts import auth, pricing
from gateway.accounts.account import NANO, Account
from gateway.accounts.service import Accounts, Charge
from gateway.adapters.responses.previous import HISTORY
from gateway.core.aliases import Chains
from gateway.core.call import Call, ClientDisconnected, Delivery, Next, Stage, staying
from gateway.core.errors import KeyRateLimited, ModelUnpriced
from gateway.core.limits import Left, RateLimiter
from gateway.core.record import Outcome, Record
from gateway.core.settings import Route, Snapshot
from providers.contract.errors import GatewayError
from providers.contract.usage import Price

# What costs nothing upstream: held and charged nothing, so it needs no price.
FREE = frozenset({"messages/count_tokens"})
# How a try ends without its provider's answer after it was sent: it may have generated.
CUT_OFF = frozenset({"unavailable", "bad_response", "timeout", "first_token_timeout",
                     "idle_timeout", "total_timeout"})


def keys(snapshot: Snapshot, accounts: Accounts | None, limiter: RateLimiter,
         accounted: Next | None = None) -> Stage:
    """The stage that finds the call's key and checks its limits. `accounted`: the stages a
    virtual key's call goes on to (its budget among them), when they are not `following`."""

    async def stage(call: Call, following: Next) -> Delivery:
        key = call.key if call.caller else await auth.admitted(call.headers, snapshot, accounts)
        call.key = key
        if key is not None:
            call.record.key_id = key.limits.key_id
            account = key if isinstance(key, Account) else None
            if account is not None and accounts is not None:
                accounts.check(account, call.record)
                if accounted is not None:
                    following = accounted
            team = account.team_limits if account is not None else None
            if (left := limiter.admit(key.limits, team)) is not None:
                rate_limited(call.record, left)
        return await following(call)

    return stage


def budget(accounts: Accounts, prices: Mapping[tuple[str, str], Price], chains: Chains,
           candidates: Callable[[str], tuple[Route, ...]]) -> Stage:
    """The stage that finds what a virtual key's request may reach (its alias's candidates,
    and the fallbacks its allow-list and budget let it use) and holds the worst case of all of
    them against its budgets. `candidates`: an alias's routes for this endpoint, unordered."""

    async def stage(call: Call, following: Next) -> Delivery:
        key = call.key
        if isinstance(key, Account):
            budgeted = bool(key.scopes) and call.endpoint not in FREE
            if budgeted:
                _priced(call.alias, call.routes, prices)
            reach = [(call.alias, route) for route in call.routes]
            fallen = chains.chains.get(call.alias)
            if fallen and (budgeted or key.models is not None):
                allowed, skipped = _fallbacks(fallen, key, budgeted, prices, candidates, reach)
                call.may_reach = allowed if skipped else None
            need = pricing.estimate(call.endpoint, call.raw, call.head,
                                    call.state.get(HISTORY, 0))
            await accounts.reserve(call.record, need, reach, prices)
        return await following(call)

    return stage


def _priced(alias: str, routes: tuple[Route, ...], prices: Mapping[tuple[str, str], Price]
            ) -> None:
    """403 `model_unpriced` when a candidate of `alias` has no price (`defaults.unpriced` is
    "refuse"): a budgeted key would be served free."""
    unpriced = [route for route in routes if (route.provider, alias) not in prices]
    if unpriced:
        served = ", ".join(f"{r.upstream_model} on {r.provider}" for r in unpriced)
        raise ModelUnpriced(f"The model '{alias[:200]}' has no known price ({served}), and this "
                            "key has a budget: the operator must price it in llms.json "
                            "(`price`, or `defaults.unpriced`)", param="model")


def _fallbacks(fallen: Mapping[str, tuple[str, ...]], key: Account, budgeted: bool,
               prices: Mapping[tuple[str, str], Price],
               candidates: Callable[[str], tuple[Route, ...]],
               reach: list[tuple[str, Route]]) -> tuple[frozenset[str], bool]:
    """The aliases of `fallen`'s chains the key may be served by (and whether any was left
    out): those its allow-list names and, for a budgeted key, whose every candidate is priced.
    Each one's candidates join `reach`, the routes the hold is priced over."""
    allowed: set[str] = set()
    skipped = False
    for name in dict.fromkeys(name for chain in fallen.values() for name in chain):
        try:
            routes = candidates(name) if key.allows(name) else ()
        except GatewayError:  # none serves it now: the chain passes over it too
            routes = ()
        if not routes or (budgeted and any((r.provider, name) not in prices for r in routes)):
            skipped = True
            continue
        allowed.add(name)
        reach += [(name, route) for route in routes]
    return frozenset(allowed), skipped


def finishing() -> Stage:
    """The stage under which a whole request held against a budget runs to its end when its
    client leaves: its provider bills the answer it generates whether or not the client
    waits, so the key is charged that answer's usage, or its hold when no answer came. The
    upstream try goes on within the call (its slot kept) and nobody is sent the answer."""

    async def stage(call: Call, following: Next) -> Delivery:
        charge = call.record.charge
        if not isinstance(charge, Charge) or charge.hold is None or call.watching is staying \
                or call.outgoing is None or call.outgoing.stream:
            return await following(call)  # nothing held, or a stream: charged as it goes
        watching, call.watching = call.watching, staying
        run = asyncio.ensure_future(following(call))
        try:
            async with watching():
                return await asyncio.shield(run)
        except ClientDisconnected:
            pass
        except BaseException:  # cancelled (a shutdown): the try goes with the call
            run.cancel()
            raise
        try:
            delivery = await run
        except asyncio.CancelledError:
            run.cancel()
            _left(call.record, None, charge)
            raise
        except Exception:  # a bug: what its tries made is unknown
            delivery = None
        _left(call.record, delivery, charge)
        return None

    return stage


def _left(record: Record, delivery: Delivery, charge: Charge) -> None:
    """End the record of a whole request whose client left: an answer (or an error the
    providers answered with) charged as if it had been sent; the hold when no answer came
    from a try that may have generated (cut off, timed out: what it made is unknown)."""
    cut = any(a.reason in CUT_OFF and (a.status is None or a.status < 400)
              for a in record.failed)
    if charge.hold is not None and (delivery is None or (cut and record.status >= 400)):
        record.cost = max(record.cost or 0.0, charge.hold.amount / NANO)
    record.end(Outcome.CLIENT_LEFT)


def rate_limited(record: Record, left: Left) -> None:
    """What a key's per-minute limits left, on the record (on the relay and passthrough alike):
    the answer's `x-ratelimit-*` headers (a refusal's too: they ride on the record), and
    429 `rate_limit_exceeded` until the window ends when a limit is used up."""
    for header, value in left.headers().items():
        record.mark(header, value)
    if left.refused is not None:
        team = left.refused.removeprefix("team:")
        whose = f"team {team}" if team != left.refused else f"key {left.refused}"
        raise KeyRateLimited(f"Rate limit reached for {whose}; retry in {left.reset:.0f}s",
                             retry_after=left.reset)
