"""The Responses API's stage: a `previous_response_id` the gateway does not hold for this key is
a 404 before the request waits or is routed, unless a candidate's upstream speaks Responses
natively (the id may be that upstream's own)."""

from __future__ import annotations

from gateway.adapters.responses.bridge import ResponsesBridge
from gateway.adapters.responses.store import ResponseStore
from gateway.adapters.stack import bare
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.errors import ResponseNotFound


def previous(store: ResponseStore) -> Stage:
    """The stage that checks a Responses request's `previous_response_id`. Another key's id
    is answered as an unknown one, so ids cannot be probed."""

    async def stage(call: Call, following: Next) -> Delivery:
        wanted = getattr(call.head, "previous_response_id", None)
        if wanted is not None and await store.get(wanted, call.record.key_id) is None:
            native = [p for r in call.routes if (p := call.providers.get(r.provider)) is not None
                      and not isinstance(bare(p), ResponsesBridge)]
            if not native:
                raise ResponseNotFound(wanted)
        return await following(call)

    return stage
