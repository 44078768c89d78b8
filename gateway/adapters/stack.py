"""Every provider as each endpoint's requests reach it: adapted once per config snapshot.

An adapter is a `Provider` wrapped in another (`providers.contract.provider.Adapter`), so the
relay makes one call whatever the endpoint: a chat provider answers `/v1/messages` through the
Messages bridge and `/v1/responses` through the Responses bridge; an embeddings batch larger
than a provider takes is split (`Batched`); whole chat and completion answers are gathered from
streams (`Assembled`) where the provider allows it; broken chat streams of aliases with
`resume` are continued (`Resuming`), below the bridges and the assembly, so all of them resume.
Moderations, rerank, images and audio are served as they are, by the providers that have them
(`native`).
Next: idempotency.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.adapters import native
from gateway.adapters.assemble import Assembled, assembles
from gateway.adapters.embeddings import Batched
from gateway.adapters.messages import MessagesBridge
from gateway.adapters.responses.bridge import ResponsesBridge
from gateway.adapters.responses.store import ResponseStore
from gateway.adapters.resume import Resuming
from gateway.core import endpoints
from gateway.core.settings import Snapshot
from gateway.routing.health import ProviderHealth
from providers.contract.provider import Adapter, Provider
from providers.contract.usage import Price

ENDPOINTS = endpoints.RELAYED

Adapted = Mapping[str, Mapping[str, Provider]]


class Outermost(Adapter):
    """An adapter `adapted` puts around all the others (a try's span, `adapters.traced`):
    what a provider is, as an endpoint reaches it, is what it wraps (`bare`)."""


def bare(provider: Provider) -> Provider:
    """The provider as its endpoint's adapters made it, under any `Outermost`."""
    return provider.inner if isinstance(provider, Outermost) else provider


def _as_is(provider: Provider) -> Provider:
    return provider


def adapt(endpoint: str, provider: Provider, store: ResponseStore,
          resuming: Callable[[Provider], Provider] = _as_is) -> Provider:
    """`provider` as `endpoint`'s requests reach it; `resuming` wraps its chat streams."""
    if endpoint == "chat/completions":
        chat = resuming(provider)
        return Assembled(chat) if assembles(provider, endpoint) else chat
    if endpoint == "completions":
        return Assembled(provider) if assembles(provider, endpoint) else provider
    if endpoint == "embeddings":
        return Batched(provider)
    if provider.supports(endpoint) or endpoint in native.ENDPOINTS:
        return provider  # a native endpoint: only providers that have it are candidates
    if endpoint == "responses":
        return ResponsesBridge(resuming(provider), store)
    return MessagesBridge(resuming(provider))


def adapted(providers: Mapping[str, Provider], store: ResponseStore,
            snapshot: Snapshot | None = None, health: ProviderHealth | None = None,
            outermost: Callable[[Provider], Provider] | None = None,
            prices: Mapping[tuple[str, str], Price] | None = None) -> Adapted:
    """Per endpoint, every provider adapted to it (`health`: the breakers and cooldowns that
    order a resume's candidates, as the router's tries); each then wrapped in `outermost` if
    given (a try's span: `gateway.adapters.traced`)."""
    resumes = {alias: policy.max_resumes for alias, policy in snapshot.policies.items()
               if policy.resume} if snapshot is not None else {}

    def resuming(provider: Provider) -> Provider:
        if not resumes:  # no alias resumes: not even the layer
            return provider
        assert snapshot is not None
        return Resuming(provider, resumes, snapshot.routes, providers, health, prices or {})

    def layered(provider: Provider, endpoint: str) -> Provider:
        made = adapt(endpoint, provider, store, resuming)
        return outermost(made) if outermost is not None else made

    return {endpoint: {name: layered(p, endpoint) for name, p in providers.items()}
            for endpoint in ENDPOINTS}
