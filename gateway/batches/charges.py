"""What a batch an upstream runs (`native`) may use, and what it costs the key that made it.

Its lines never pass the relay's stages, so the same rules are applied here, line by line: a
virtual key limited to some models is refused a file naming another (403 naming the line, when
the file is uploaded and again when the batch is made, as the key may have changed between);
the batch's worst case, each line's priced as the relay prices one (`pricing.worst_case`), is
held against the key's budgets when it is made (429 when one cannot take it); and when the
upstream says it ended, it is charged what its output's usage costs, once (the status moves in
one conditional update), its hold settled by the process that holds it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import msgspec

from gateway.accounts import pricing
from gateway.accounts.account import Account, window
from gateway.accounts.ledger import Hold
from gateway.accounts.service import Charge
from gateway.batches import jsonl
from gateway.core.errors import ModelNotAllowed
from gateway.core.record import Record
from gateway.core.settings import GatewayKey
from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError
from providers.contract.usage import Usage, cost, from_payload

ENDPOINT = "batches"  # what a batch's spend row says it was


class _Response(msgspec.Struct):
    body: msgspec.Raw = msgspec.Raw(b"null")


class _Output(msgspec.Struct):
    custom_id: str | None = None
    response: _Response | None = None


def _alias(runtime: Runtime, model: str) -> str | None:
    try:
        return runtime.live.snapshot.resolve(model)
    except GatewayError:
        return None


def check_models(runtime: Runtime, key: GatewayKey | Account | None,
                 lines: Sequence[jsonl.Request]) -> None:
    """403 model_not_allowed naming the first line whose model the key may not use."""
    if not isinstance(key, Account) or key.models is None:
        return
    for line in lines:
        alias = _alias(runtime, line.model)
        if alias is None or not key.allows(alias):
            raise ModelNotAllowed(f"Line {line.line} of the file names the model "
                                  f"'{line.model[:200]}', which this key may not use",
                                  param="model")


async def hold(runtime: Runtime, key: GatewayKey | Account | None, endpoint: str,
               lines: Sequence[jsonl.Request]) -> Charge | None:
    """The batch's worst case held against a virtual key's budgets (None for any other key);
    429 budget_exceeded when it does not fit."""
    accounts, live = runtime.accounts, runtime.live
    if not isinstance(key, Account) or accounts is None:
        return None
    amount = 0
    for line in lines:
        alias = _alias(runtime, line.model) or ""
        routes = live.snapshot.routes.get(alias, ())
        amount += pricing.worst_case(endpoint, pricing.estimate(endpoint, line.body),
                                     [(alias, route) for route in routes], live.prices)
    return await accounts.hold(key, amount)


def charge(runtime: Runtime, row: Mapping[str, Any], asked: bytes | None, output: bytes,
           holds: MutableMapping[str, Charge]) -> None:
    """Charge an ended batch's owner what the usage in its `output` file costs (each line at
    its alias's price, from the input file `asked`), settling its hold (this process's, if it
    holds it; else the spend is counted alone)."""
    accounts = runtime.accounts
    held = holds.pop(row["id"], None)
    if accounts is None:
        return
    account = held.account if held is not None \
        else accounts.directory.known.by_id.get(row["owner"])
    if account is None:
        return  # not a virtual key (or revoked since): no budget to count against
    usage, dollars, alias = _spent(runtime, row["provider"], asked, output)
    record = Record(row["id"], ENDPOINT, ())
    record.key_id, record.team, record.provider = row["owner"], account.team, row["provider"]
    record.alias, record.known_model = alias, alias is not None
    record.usage, record.cost = usage, dollars
    record.charge = held if held is not None else _unheld(account, accounts.shared is not None)
    accounts.ended(record)


def _unheld(account: Account, shared: bool) -> Charge:
    """A charge for a batch whose hold another process has (or had): its cost is counted
    against the same budgets, and that hold lapses at its deadline."""
    now = time.time()
    entries = tuple((scope.id, window(scope.budget.period, now)[0]) for scope in account.scopes)
    return Charge(account, hold=Hold(f"batch-{now}", entries, 0, 0.0), shared=shared)


def _spent(runtime: Runtime, provider: str, asked: bytes | None, output: bytes
           ) -> tuple[Usage, float, str | None]:
    """The usage in a batch's output file, what it costs at each line's alias's price, and
    the first line's alias."""
    lines = _lines(runtime, asked)
    aliases = {line.custom_id: _alias(runtime, line.model) for line in lines}
    total, dollars = Usage(), 0.0
    for text in output.splitlines():
        try:
            out = msgspec.json.decode(text, type=_Output)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        usage = from_payload(bytes(out.response.body)) if out.response is not None else None
        if usage is None:
            continue
        total.prompt_tokens += usage.prompt_tokens
        total.completion_tokens += usage.completion_tokens
        total.total_tokens += usage.total_tokens
        price = runtime.price_of(provider, aliases.get(out.custom_id or "") or "")
        if price is not None:
            dollars += cost(usage, price)
    return total, dollars, next(iter(aliases.values()), None)


def _lines(runtime: Runtime, asked: bytes | None) -> list[jsonl.Request]:
    if asked is None:
        return []
    try:
        return jsonl.parse(asked, runtime.live.snapshot.batches)
    except GatewayError:
        return []
