"""The gateway asking one of its own aliases on behalf of a request (a guardrail's judge).

The question runs through the endpoint's whole stack, as a batch line does
(`gateway.batches.runner`): routing, failover, its own record (logged, traced, counted) and
spend. It runs as the request's key (`Call.caller`), so the key's budgets pay for it and its
spend rows name the key; but it is part of the request the key's limits already counted, so it
holds no parallel slot of its own, counts against no per-minute limit, and needs no place on
the key's model allow-list (the operator chose the alias).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.accounts.account import Account
from gateway.core.call import Call, Identity, Meter
from gateway.core.delivery import Streamed
from gateway.core.limits import KeyLimits
from gateway.core.record import Outcome, Record, request_id
from gateway.guardrails.judges import ASKING, Ask
from gateway.pipeline import relay
from gateway.state.runtime import Runtime
from providers.contract.stream import close_quietly

_HEADERS: Mapping[str, str] = {"content-type": "application/json"}
# A judge's answer is a verdict: what more comes is read no further.
MAX_ANSWER = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class _Beside:
    """A configured key, as a question asked for one of its requests: no limits of its own."""

    limits: KeyLimits


def beside(key: Identity | None) -> Identity | None:
    """What a question asked for `key`'s request runs as: the key for its spend and budgets,
    without the limits its request already passed."""
    if key is None:
        return None
    own = key.limits
    limits = KeyLimits(own.key_id, priority=own.priority, max_priority=own.max_priority,
                       timeout=own.timeout, weight=own.weight)
    if isinstance(key, Account):
        return dataclasses.replace(key, models=None, limits=limits, team_limits=None, slots=())
    return _Beside(limits)


def asker(runtime: Runtime) -> Ask:
    """Ask an alias through the live stack on behalf of a call: its status and body."""

    async def ask(endpoint: str, body: bytes, asking: Call) -> tuple[int, bytes]:
        async def read(meter: Meter) -> bytes:
            return body

        record = Record(request_id(_HEADERS), endpoint, runtime.listeners)
        record.detail["judging"] = asking.record.request_id
        call = Call(endpoint, _HEADERS, record, read, key=beside(asking.key), caller=True)
        call.state[ASKING] = True
        try:
            answer = await relay.handle(call, runtime)
            if answer is None:
                return 499, b""
            if isinstance(answer, Streamed):
                return answer.status, await _read(answer)
            answer.record.end(answer.outcome)
            return answer.status, answer.body
        except asyncio.CancelledError:  # its judge's time is up: the asker left
            record.end(Outcome.CLIENT_LEFT)
            raise
        finally:
            call.close()

    return ask


async def _read(answer: Streamed) -> bytes:
    """A streamed answer, read whole (up to `MAX_ANSWER`)."""
    parts: list[Any] = []
    size = 0
    try:
        async for chunk in answer.chunks:
            parts.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                break
    finally:
        await close_quietly(answer.chunks)
    return b"".join(parts)
