"""The Responses API's stage: a `previous_response_id` the gateway does not hold for this key is
a 404 before the request waits or is routed, unless a candidate's upstream speaks Responses
natively (the id may be that upstream's own)."""

from __future__ import annotations

import msgspec

from gateway.adapters.responses.bridge import ResponsesBridge
from gateway.adapters.responses.store import ResponseStore
from gateway.adapters.stack import bare
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.errors import ResponseNotFound

# `Call.state`'s entry for the bytes of the stored conversation a request continues.
HISTORY = "previous.history"


def previous(store: ResponseStore) -> Stage:
    """The stage that checks a Responses request's `previous_response_id`, and hands the
    budget the size of the conversation it continues (`HISTORY`: bytes of JSON, as the bridge
    sends it). Another key's id is answered as an unknown one, so ids cannot be probed."""

    async def stage(call: Call, following: Next) -> Delivery:
        wanted = getattr(call.head, "previous_response_id", None)
        if wanted is None:
            return await following(call)
        history = await store.get(wanted, call.record.key_id)
        if history is not None:
            call.state[HISTORY] = len(msgspec.json.encode(history))
        else:
            native = [p for r in call.routes if (p := call.providers.get(r.provider)) is not None
                      and not isinstance(bare(p), ResponsesBridge)]
            if not native:
                raise ResponseNotFound(wanted)
        return await following(call)

    return stage
