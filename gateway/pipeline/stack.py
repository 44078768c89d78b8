"""The stages of each relay endpoint, composed once per config snapshot, in one place.

In order, outermost first (each owned by its folder):

    keys        gateway/accounts/stage.py        who it runs as; expiry, parallel, rate limits
    room        gateway/queue/stage.py           its ticket; refused at once when full
    admission   gateway/pipeline/admission.py    head typed, alias, candidates, the request
    guardrails  gateway/guardrails/stage.py      text screened; the answer's values given back
    capture     gateway/requestlog/capture.py    what the request log keeps of its bodies
    previous    gateway/adapters/responses/      a Responses `previous_response_id` known
    budget      gateway/accounts/stage.py        the worst case held, as it goes upstream
    mcp tools   gateway/adapters/mcp_loop.py     gateway MCP tools run as a loop: a Responses
                                                 request's `mcp` tools, a Messages request's
                                                 `mcp_servers` (`mcp_connector/`)
    turn        gateway/queue/stage.py           the wait for a slot
    idempotency gateway/idempotency/stage.py     an `Idempotency-Key` answered once
    cache       gateway/cache/stage.py           a hit answered, an answer kept
    semantic    gateway/cache/semantic_stage.py  a question near one kept answered with its answer
    finishing   gateway/accounts/stage.py        a held whole request read to its end, charged
    serve       gateway/pipeline/relay.py        route, then deliver

A stage is built only when something in force can use it: `guardrails` when llms.json has
one, on the endpoints that carry text; `capture` with `logs` in llms.json; `budget` with
accounts, `previous` on `/v1/responses`, `idempotency` on the endpoints that generate,
`mcp tools` on `/v1/responses` and `/v1/messages` when llms.json has an MCP server,
`cache` on those it serves when some alias caches, `semantic` on chat when some alias has
`cache.semantic`, `finishing` with accounts. Tracing's span is what the edge serves the
whole call within (`Runtime.serving`), so it also covers writing the answer.

`budget` and `finishing` act for a virtual key alone (only its call holds a charge), so the
stages after `keys` are composed twice: with them for a call whose key is a virtual one, and
without them for any other (a static key, or none on an open gateway). `keys`, which finds the
identity, goes on down the one composed for it: a call pays for no stage its identity never
uses.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.accounts import stage as accounts
from gateway.adapters.mcp_connector.dialect import connector
from gateway.adapters.responses.previous import previous
from gateway.adapters.responses.tool_loop import tool_loop
from gateway.cache import semantic_stage as semantic
from gateway.cache import stage as cache
from gateway.cache.embedding import Embedder
from gateway.core.call import Next, Stage, compose
from gateway.guardrails import policies as guarding
from gateway.guardrails.stage import guarded, guardrails
from gateway.idempotency import flight
from gateway.idempotency.stage import idempotency
from gateway.pipeline.admission import HEADS, able, admission
from gateway.pipeline.asking import asker
from gateway.pipeline.relay import innermost
from gateway.queue import stage as queue
from gateway.requestlog.capture import capture
from gateway.routing.router import Routing
from gateway.state.runtime import Live, Runtime

# The endpoints whose requests may name gateway MCP servers, and the loop each runs them with.
LOOPS = {"responses": tool_loop, "messages": connector}


def stacks(runtime: Runtime, live: Live) -> Mapping[str, Next]:
    """Every relay endpoint's stages for `live`'s snapshot, as one callable each."""
    return {endpoint: stack(runtime, live, endpoint) for endpoint in HEADS}


def stack(runtime: Runtime, live: Live, endpoint: str) -> Next:
    """`endpoint`'s stages for `live`'s snapshot as one callable: `keys`, then the stages
    composed for the identity it finds (those of a virtual key only for one)."""
    serve = innermost(runtime, live, endpoint)
    after = stages(runtime, live, endpoint)
    plain = compose([stage for stage, virtual in after if not virtual], serve)
    accounted = compose([stage for stage, _ in after], serve) \
        if any(virtual for _, virtual in after) else None
    return compose([accounts.keys(live.snapshot, runtime.accounts, runtime.limiter, accounted)],
                   plain)


def stages(runtime: Runtime, live: Live, endpoint: str) -> list[tuple[Stage, bool]]:
    """The stages a call to `endpoint` passes after `keys` under `live`'s snapshot, outermost
    first, each with whether it acts for a virtual key's call alone."""
    snapshot, accounting = live.snapshot, runtime.accounts
    # Each with whether a virtual key's call alone passes it.
    built: list[tuple[Stage, bool]] = [
        (queue.room(runtime.queue, snapshot.server.queue_timeout, runtime.enter, runtime.leave),
         False),
        (admission(runtime, live, endpoint), False),
    ]
    if guarding.configured(snapshot) and guarded(endpoint):  # before anything keeps the text
        built.append((guardrails(guarding.Guardrails(snapshot, runtime.entity_models),
                                 runtime.metrics,
                                 runtime.guardrails, live.redactor, asker(runtime)), False))
    if snapshot.logs is not None:  # inside the guardrails: it keeps what providers see
        built.append((capture(snapshot), False))
    if endpoint == "responses":  # before the budget: the hold prices the whole conversation
        built.append((previous(runtime.responses), False))
    if accounting is not None:
        built.append((accounts.budget(accounting, live.prices, snapshot.chains,
                                      lambda alias: able(live, endpoint, alias)), True))
    if endpoint in LOOPS and snapshot.mcp_servers:  # one hold; each round waits its turn
        built.append((LOOPS[endpoint](lambda: runtime.tools, snapshot.mcp,
                                      {server.name for server in snapshot.mcp_servers}), False))
    built.append((queue.turn(runtime.queue), False))
    if endpoint in flight.ENDPOINTS:
        built.append((idempotency(runtime.idempotency, snapshot.idempotency), False))
    if cache.caches(snapshot, endpoint):
        built.append((cache.stage_of(snapshot, runtime.cache, runtime.metrics), False))
    if semantic.caches(snapshot, endpoint):
        embedder = Embedder(snapshot, live.providers, live.adapted["embeddings"], live.prices,
                            Routing(runtime.health, runtime.latencies))
        built.append((semantic.stage_of(snapshot, runtime.semantic, embedder, runtime.metrics),
                      False))
    if accounting is not None:
        built.append((accounts.finishing(), True))
    return built
