"""A request's admission: everything decided before an upstream is called.

The key and its limits (a virtual key's: its expiry, parallel requests, team, aliases and budgets,
`gateway.accounts`), the request's turn (`x-llms-priority`, `x-llms-timeout`), the body's head
(typed, a wrong type a 400 naming its `param`), the alias's candidates in the order its strategy
gives, its worst-case cost held against its budgets, and last its wait for a slot under the
process's concurrency cap (`queueing`): a request that would be refused anyway is refused without
waiting, and its body is read before it waits (the guard's body deadline runs from the request's
head). The head's size and the body's deadline were checked by `gateway.edge.guard`, in front of
every route.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from litestar.types import Receive

from gateway.accounts.account import Account
from gateway.accounts.service import Accounts
from gateway.adapters import embeddings, native
from gateway.adapters.responses.bridge import ResponsesBridge
from gateway.adapters.stack import bare
from gateway.edge import auth
from gateway.edge.disconnect import DisconnectGuard
from gateway.pipeline import router, schemas, strategy
from gateway.pipeline.limits import KeyLimits
from gateway.pipeline.queueing import Ticket, turn_of
from gateway.pipeline.record import Record
from gateway.state.config import GatewayKey, Route, Snapshot
from gateway.state.runtime import Runtime
from providers.contract.errors import KeyRateLimited, ModelNotFound, ResponseNotFound
from providers.contract.messages import CountTokensRequest, MessagesRequest
from providers.contract.provider import Provider

HEADS: Mapping[str, type[Any]] = {
    "chat/completions": schemas.ChatHead,
    "completions": schemas.CompletionHead,
    "responses": schemas.ResponsesHead,
    "embeddings": schemas.EmbeddingsHead,
    "messages": MessagesRequest,
    "messages/count_tokens": CountTokensRequest,
    "moderations": schemas.ModerationsHead,
    "rerank": schemas.RerankHead,
    "images/generations": schemas.ImagesHead,
    "images/edits": schemas.ImageEditHead,
    "audio/speech": schemas.SpeechHead,
    "audio/transcriptions": schemas.TranscriptionHead,
    "audio/translations": schemas.TranscriptionHead,
}


class Incoming(Protocol):
    """What the pipeline reads of a request (`front.RawRequest`)."""

    scope: Any
    receive: Receive
    ticket: Ticket  # its claim on a slot under the concurrency cap

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def body(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed every check: its parsed head, the body to send, its candidates
    and the providers as its endpoint reaches them."""

    head: Any
    raw: bytes
    alias: str  # what serves the name the client sent (`alias_of`, a pattern)
    routes: tuple[Route, ...]
    providers: Mapping[str, Provider]
    priority: int = 0  # its priority in the queue, for a provider's own (a pool's line)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request runs as when no client presents a key: a batch's requests run as the key
    that made the batch (None: no key, as on a gateway without keys)."""

    key: GatewayKey | Account | None


async def admit(request: Incoming, runtime: Runtime, record: Record,
                caller: Caller | None = None) -> Admitted:
    """Check the request, find its candidates and wait for its slot; a `GatewayError` when
    it cannot go on. `caller`: the key it runs as, else the one its headers present."""
    live, endpoint, accounts = runtime.live, record.endpoint, runtime.accounts
    key = caller.key if caller is not None \
        else auth.check(request.headers, live.snapshot, accounts)
    account = key if isinstance(key, Account) else None
    if key is not None:
        record.key_id = key.limits.key_id
        if account is not None and accounts is not None:
            accounts.check(account, record)
        _rate_limited(runtime, key.limits)
        if account is not None and account.team_limits is not None:
            _rate_limited(runtime, account.team_limits)
    turn = turn_of(request.headers, key.limits if key is not None else None,
                   live.snapshot.server.queue_timeout)
    runtime.queue.check_room(turn)
    head, raw = schemas.parse(await request.body(), HEADS[endpoint],
                              request.headers.get("content-type"))
    record.model, record.stream = head.model, bool(getattr(head, "stream", False))
    alias = _alias(live.snapshot, head.model, account, accounts)
    routes = ordered(runtime, endpoint, alias)
    record.known_model, record.alias = True, alias
    providers = live.adapted[endpoint]
    if account is not None and accounts is not None:  # before the wait: what it may cost
        await accounts.reserve(record, raw, alias, routes, live.prices)
    if endpoint == "responses":
        await _check_previous_response(runtime, head, routes, providers, record.key_id)
    if not runtime.queue.start_now(request.ticket, turn):
        async with DisconnectGuard(request.receive):  # a client that leaves leaves the queue
            await runtime.queue.wait(request.ticket, turn)
        record.detail["queued_ms"] = round(request.ticket.waited * 1000, 2)  # its log line
    return Admitted(head, raw, alias, routes, providers, turn.priority)


def _rate_limited(runtime: Runtime, limits: KeyLimits) -> None:
    if (wait := runtime.limiter.admit(limits)) is not None:
        raise KeyRateLimited(f"Rate limit reached for key {limits.key_id}; "
                             f"retry in {wait:.0f}s", retry_after=wait)


def _alias(snapshot: Snapshot, model: str, account: Account | None,
           accounts: Accounts | None) -> str:
    """The alias `model` names; for a key limited to some aliases, a 403 for any other name,
    known or not."""
    if account is None or account.models is None or accounts is None:
        return snapshot.resolve(model)
    try:
        alias: str | None = snapshot.resolve(model)
    except ModelNotFound:
        alias = None
    accounts.check_model(account, alias, model)
    assert alias is not None
    return alias


def ordered(runtime: Runtime, endpoint: str, alias: str) -> tuple[Route, ...]:
    """`alias`'s candidates for `endpoint`, in the order its strategy gives; ModelNotFound
    when none serves it."""
    live = runtime.live
    routes = router.candidates(live.snapshot, alias)
    if endpoint == embeddings.ENDPOINT:
        routes = embeddings.embedding_routes(alias, routes, live.providers)
    elif endpoint in native.ENDPOINTS:
        routes = native.able_routes(endpoint, alias, routes, live.providers)
    return strategy.ordered(alias, routes, live.snapshot.policy(alias).routing,
                            runtime.spread, runtime.latencies)


async def _check_previous_response(runtime: Runtime, head: Any, routes: tuple[Route, ...],
                                   providers: Mapping[str, Provider],
                                   key_id: str | None) -> None:
    """An id the gateway holds for this key continues there; others may belong to a native
    upstream. Another key's id is answered as an unknown one, so ids cannot be probed."""
    previous = getattr(head, "previous_response_id", None)
    if previous is None or await runtime.responses.get(previous, key_id) is not None:
        return
    native = [p for r in routes if (p := providers.get(r.provider)) is not None
              and not isinstance(bare(p), ResponsesBridge)]
    if not native:
        raise ResponseNotFound(previous)
