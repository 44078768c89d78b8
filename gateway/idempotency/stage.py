"""The idempotency stage: a request with an `Idempotency-Key` runs the stages after this one as
a flight (`gateway.idempotency.flight`), which no client's leaving cancels; a retry joins it or
is replayed. Built for the endpoints that generate (`flight.ENDPOINTS`)."""

from __future__ import annotations

from collections.abc import Awaitable

from gateway.core.call import Call, Delivery, Next, Stage, staying
from gateway.core.settings import IdempotencyConfig
from gateway.idempotency.flight import Idempotency, answer, keyed


def idempotency(keys: Idempotency, config: IdempotencyConfig) -> Stage:
    """The stage that answers a keyed request once, whoever asks again."""

    def stage(call: Call, following: Next) -> Awaitable[Delivery]:
        sent = keyed(call.headers, call.record)
        if sent is None:
            return following(call)
        # The run is the flight's, not this client's: what follows watches no client.
        watching, call.watching = call.watching, staying
        return answer(keys, sent, call.raw, call.record, config, watching,
                      lambda: following(call))

    return stage
