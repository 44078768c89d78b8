"""A request's admission: everything decided before an upstream is called.

The key and its limits, the process's concurrency cap, the body's head (typed, a wrong type a
400 naming its `param`), the alias's candidates in the order its strategy gives. The head's
size and the body's deadline were checked by `gateway.edge.guard`, in front of every route.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from litestar.types import Receive

from gateway.adapters import embeddings
from gateway.adapters.responses.bridge import ResponsesBridge
from gateway.adapters.stack import bare
from gateway.edge import auth
from gateway.pipeline import router, schemas, strategy
from gateway.pipeline.record import Record
from gateway.state.config import Route
from gateway.state.runtime import Runtime
from providers.contract.errors import KeyRateLimited, Overloaded, ResponseNotFound
from providers.contract.messages import CountTokensRequest, MessagesRequest
from providers.contract.provider import Provider

HEADS: Mapping[str, type[Any]] = {
    "chat/completions": schemas.ChatHead,
    "completions": schemas.CompletionHead,
    "responses": schemas.ResponsesHead,
    "embeddings": schemas.EmbeddingsHead,
    "messages": MessagesRequest,
    "messages/count_tokens": CountTokensRequest,
}


class Incoming(Protocol):
    """What the pipeline reads of a request (`front.RawRequest`)."""

    scope: Any
    receive: Receive

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


async def admit(request: Incoming, runtime: Runtime, record: Record) -> Admitted:
    """Check the request and find its candidates; a `GatewayError` when it cannot go on."""
    live, endpoint = runtime.live, record.endpoint
    key = auth.check(request.headers, live.snapshot)
    if key is not None:
        record.key_id = key.limits.key_id
        if (wait := runtime.limiter.admit(key.limits)) is not None:
            raise KeyRateLimited(f"Rate limit reached for key {key.limits.key_id}; "
                                 f"retry in {wait:.0f}s", retry_after=wait)
    if runtime.inflight > live.snapshot.server.max_concurrency:  # this one holds a slot too
        raise Overloaded("The gateway is at its concurrency limit; retry shortly")
    head, raw = schemas.parse(await request.body(), HEADS[endpoint])
    record.model, record.stream = head.model, bool(getattr(head, "stream", False))
    alias = live.snapshot.resolve(head.model)
    routes = ordered(runtime, endpoint, alias)
    record.known_model, record.alias = True, alias
    providers = live.adapted[endpoint]
    if endpoint == "responses":
        await _check_previous_response(runtime, head, routes, providers, record.key_id)
    return Admitted(head, raw, alias, routes, providers)


def ordered(runtime: Runtime, endpoint: str, alias: str) -> tuple[Route, ...]:
    """`alias`'s candidates for `endpoint`, in the order its strategy gives; ModelNotFound
    when none serves it."""
    live = runtime.live
    routes = router.candidates(live.snapshot, alias)
    if endpoint == embeddings.ENDPOINT:
        routes = embeddings.embedding_routes(alias, routes, live.providers)
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
