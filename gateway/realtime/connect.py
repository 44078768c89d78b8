"""A session's upstream, dialled with failover: the alias's Realtime candidates in order.

The candidates are the alias's routes whose model entry says `realtime: true`, in the order
the breakers leave them (`routing.health.plan`: routes ready now first, those whose circuit is
open or that cool down after a 429 last). Each is dialled once: a refused connection, a 5xx, a
429, a 401/403/404 or no handshake within the provider's `timeouts.connect` moves to the next
(and counts for its breaker, as a request's try does); when none opens, the session is refused
with `provider_error`, each attempt listed. Once a socket is open the candidate has answered.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from gateway.core.errors import AllProvidersFailed, Attempt
from gateway.core.record import Record
from gateway.core.settings import Route
from gateway.state.runtime import Live, Runtime
from providers.contract.errors import ProviderError
from providers.contract.transport import UpstreamSocket


def candidates(live: Live, alias: str) -> list[Route]:
    """The alias's routes that serve the Realtime API, in file order."""
    found = []
    for route in live.snapshot.routes.get(alias, ()):
        provider = live.providers.get(route.provider)
        entry = provider.spec.models.get(alias) if provider is not None else None
        if entry is not None and entry.realtime:
            found.append(route)
    return found


async def dial(runtime: Runtime, live: Live, routes: Sequence[Route], record: Record,
               beta: bool) -> tuple[Route, UpstreamSocket]:
    """The first candidate whose WebSocket opens, and that socket; AllProvidersFailed when
    none does (its attempts also on `record.failed`)."""
    health, failed = runtime.health, []
    max_frame = live.snapshot.realtime.max_frame_bytes
    for planned in health.plan(routes, lambda name: live.providers[name].spec.circuit):
        route = planned.route
        provider = live.providers[route.provider]
        policy = provider.spec.circuit
        claim = health.acquire(planned, policy)
        if claim is None and not planned.forced:
            failed.append(Attempt(route.provider, None, "circuit_open",
                                  "its circuit is open"))
            continue
        started = time.perf_counter()
        try:
            socket = await provider.realtime(route.upstream_model, beta, max_frame)
        except ProviderError as exc:
            health.failed(route, policy, exc, claim)
            failed.append(Attempt(route.provider, exc.upstream_status, exc.reason,
                                  live.redactor.text(exc.message), exc.retry_after))
            continue
        finally:
            record.upstream_wait += time.perf_counter() - started
        health.succeeded(planned, policy)
        record.failed, record.provider = tuple(failed), route.provider
        return route, socket
    record.failed = tuple(failed)
    raise AllProvidersFailed(record.model or "", failed)
