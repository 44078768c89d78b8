"""A Realtime session's money: its key's budgets checked before it opens, charged as it goes.

A session cannot be held at its worst case (it lasts as long as its client wants), so it is
charged what each response cost as its `response.done` arrives: the cost is reserved against
every budget the key falls under and settled at once, in the same ledger requests use (this
process's, the machine's file, or Redis). A response that does not fit is charged all the same
(it was generated: its provider bills it) and ends the session; so does one that leaves a
budget with nothing. Before the upstream is dialled, a budget with nothing left refuses the
session (429 budget_exceeded), as it refuses a request; a budgeted key never reaches a model
without a price. The session's one record carries its total for the spend row, with no hold of
its own (`Accounts.ended` then writes the row and settles nothing twice).
"""

from __future__ import annotations

import time

from gateway.accounts.account import Account, nano, window
from gateway.accounts.ledger import Hold
from gateway.accounts.service import Accounts, Charge
from gateway.core.errors import BudgetExceeded, ModelUnpriced
from providers.contract.usage import Price

# What a session is checked against before it opens: a budget that cannot take a nano-dollar
# more has nothing left.
LEAST = 1


async def admit(accounts: Accounts | None, key: object, priced: bool) -> None:
    """Refuse a budgeted key a session when a budget is spent, or its model has no price."""
    if accounts is None or not isinstance(key, Account) or not key.scopes:
        return
    if not priced:
        raise ModelUnpriced("This key has a budget and this Realtime model has no price: it "
                            "would be served free", param="model")
    accounts.release(await accounts.hold(key, LEAST))


async def charge(accounts: Accounts | None, key: object, dollars: float) -> bool:
    """Charge one response's `dollars` to the key's budgets now; whether the session must end
    because a budget is spent."""
    if accounts is None or not isinstance(key, Account) or not key.scopes:
        return False
    amount = nano(dollars)
    try:
        held = await accounts.hold(key, amount)
    except BudgetExceeded:
        _settle(accounts, _unheld(key, accounts.shared is not None), amount)
        return True
    _settle(accounts, held, amount)
    return held.hold is not None and held.hold.remaining <= 0


def _settle(accounts: Accounts, charge: Charge, amount: int) -> None:
    if charge.hold is None:
        return
    ledger = accounts.shared if charge.shared and accounts.shared is not None \
        else accounts.local
    ledger.settle(charge.hold, amount)


def _unheld(account: Account, shared: bool) -> Charge:
    """A charge with no reservation behind it, against the key's budgets in their current
    periods: what a response that did not fit still cost is counted."""
    now = time.time()
    entries = tuple((scope.id, window(scope.budget.period, now)[0]) for scope in account.scopes)
    return Charge(account, hold=Hold(f"realtime-{now}", entries, 0, 0.0), shared=shared)


def price_known(price: Price | None, unpriced: Price | None) -> Price | None:
    """The price a session's responses are charged at: the model's, else `defaults.unpriced`."""
    return price if price is not None else unpriced
