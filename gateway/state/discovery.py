"""`"models": "*"`: list each such provider's models at startup and every few minutes.

A provider that cannot be listed keeps what it last listed (nothing, at first) and is logged
once until it can again; a change in any listing makes a new live, as a config edit does.
"""

from __future__ import annotations

import asyncio

from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError
from providers.contract.log import get_logger


async def refresh(runtime: Runtime, failing: set[str]) -> bool:
    """List every discovering provider once; True if any listing changed."""
    log = get_logger()
    changed = False
    configured = runtime.configured
    if configured is None:
        return False
    for spec in configured.providers:
        provider = runtime.live.providers.get(spec.name)
        if spec.discovery is None or not spec.enabled or provider is None:
            continue
        try:
            listed = await provider.list_models()
        except (GatewayError, NotImplementedError) as exc:
            if spec.name not in failing:
                failing.add(spec.name)
                log.warning("model_discovery_failed", provider=spec.name,
                            error=getattr(exc, "message", str(exc)))
            continue
        failing.discard(spec.name)
        kept = tuple(sorted(m for m in listed if spec.discovery.keeps(m)))
        if runtime.discovered.get(spec.name) != kept:
            runtime.discovered[spec.name] = kept
            changed = True
            log.info("models_discovered", provider=spec.name, models=len(kept))
    return changed


async def watch(runtime: Runtime) -> None:
    """Refresh now, then at the shortest interval any discovering provider asks for."""
    failing: set[str] = set()
    while True:
        if await refresh(runtime, failing) and runtime.configured is not None:
            await runtime.apply(runtime.configured)
        intervals = [p.discovery.interval for p in (runtime.configured.providers
                     if runtime.configured else ()) if p.discovery is not None]
        # With none discovering yet, look again soon: a reload may add one.
        await asyncio.sleep(min(intervals, default=5.0))
