"""Admission: the body's head typed, the alias found, its candidates ordered, the request made
ready to send. Always in the stack, between the stages that need only the headers (`keys`, the
queue's `room`) and those that need what it parsed (`budget`, the queue's `turn`, idempotency,
the cache).

The body's head is typed by msgspec (a wrong type is a 400 naming its `param`), the name sent
resolved to its alias (`Snapshot.resolve`; a key limited to some aliases gets a 403 for any
other name, known or not), its candidates listed in the order the alias's strategy gives (or
the request's own sort and price bound, `gateway.pipeline.preferences`, OpenRouter's `provider`
object taken out of the body), and the request built once as the providers get it (`Outgoing`,
named for its alias).
"""

from __future__ import annotations

from gateway.accounts.account import Account
from gateway.accounts.service import Accounts
from gateway.adapters import embeddings, native, tools
from gateway.core import endpoints, schemas
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.errors import ModelNotFound
from gateway.core.schemas import FormHead
from gateway.core.settings import Route, Snapshot
from gateway.pipeline import preferences
from gateway.routing import router, sorting, strategy
from gateway.routing.fallbacks import as_alias
from gateway.state.runtime import Live, Runtime
from providers.contract.provider import Outgoing

HEADS = endpoints.HEADS


def admission(runtime: Runtime, live: Live, endpoint: str) -> Stage:
    """The stage that parses the call's head and finds its candidates (`live`: the snapshot
    it is built for)."""
    snapshot, providers, accounts = live.snapshot, live.adapted[endpoint], runtime.accounts
    head_type = HEADS[endpoint]
    messages = endpoint in endpoints.ANTHROPIC
    priced = preferences.prices_routes(snapshot)  # then every request is priced per alias

    async def stage(call: Call, following: Next) -> Delivery:
        record = call.record
        head, raw = await schemas.parsed(await call.read(), head_type,
                                         call.headers.get("content-type"))
        record.model, record.stream = head.model, bool(getattr(head, "stream", False))
        alias = _alias(snapshot, head.model, call.key, accounts)
        # `find`, not `in`: `in` on bytes makes and drops a TypeError each time.
        if priced or raw.find(b'"provider"') >= 0 or sorting.HEADER in call.headers:
            raw, call.asked = preferences.asked(endpoint, call.headers, raw, head, priced)
        call.routes = ordered(runtime, live, endpoint, alias, call.asked)
        if getattr(head, "tools", None):
            call.routes = tools.tool_routes(alias, call.routes, providers)
        record.known_model, record.alias = True, alias
        call.head, call.raw, call.alias, call.providers = head, raw, alias, providers
        options = getattr(head, "stream_options", None)
        call.wants_usage = bool(options and options.include_usage) or messages
        call.outgoing = as_alias(Outgoing(
            endpoint, raw, head.model, record.stream, record.request_id,
            client_wants_usage=call.wants_usage, key_id=record.key_id,
            choices=getattr(head, "n", None) or 1, betas=call.headers.get("anthropic-beta"),
            priority=call.priority,
            content_type=call.headers.get("content-type") if isinstance(head, FormHead)
            else None), alias)
        record.resumes = call.outgoing.resumes
        if runtime.trace is not None:  # the stage profiler's `admitted` (`Runtime.trace`)
            runtime.trace("admitted")
        return await following(call)

    return stage


def _alias(snapshot: Snapshot, model: str, key: object, accounts: Accounts | None) -> str:
    """The alias `model` names; for a key limited to some aliases, a 403 for any other name,
    known or not."""
    if not isinstance(key, Account) or key.models is None or accounts is None:
        return snapshot.resolve(model)
    try:
        alias: str | None = snapshot.resolve(model)
    except ModelNotFound:
        alias = None
    accounts.check_model(key, alias, model)
    assert alias is not None
    return alias


def ordered(runtime: Runtime, live: Live, endpoint: str, alias: str,
            asked: preferences.Asked | None = None) -> tuple[Route, ...]:
    """`alias`'s candidates for `endpoint` under `live` (the snapshot the call's stages were
    composed for), in the order its strategy (or the request's own sort, `asked`) gives;
    ModelNotFound when none serves it."""
    routes = able(live, endpoint, alias)
    if asked is not None:
        return preferences.ordered(runtime, alias, routes, asked)
    return strategy.ordered(alias, routes, live.snapshot.policy(alias).routing,
                            runtime.spread, runtime.latencies, throughputs=runtime.throughputs)


def able(live: Live, endpoint: str, alias: str) -> tuple[Route, ...]:
    """`alias`'s candidates under `live` that can serve `endpoint`, in file order (no
    strategy's turn taken); a `GatewayError` when none can."""
    routes = router.candidates(live.snapshot, alias)
    if endpoint == embeddings.ENDPOINT:
        return embeddings.embedding_routes(alias, routes, live.providers)
    if endpoint in native.ENDPOINTS:
        return native.able_routes(endpoint, alias, routes, live.providers)
    return routes
