"""From a pool's settings to a started `Pool`: find GPUs, choose the engine, ready the weights,
plan the workers. Everything here runs once per pool config, not per request."""

from __future__ import annotations

from pathlib import Path

from providers.contract.log import get_logger
from providers.contract.spec import Secret
from providers.contract.transport import Link, Transport
from providers.kinds.pool import gpus
from providers.kinds.pool.engines import choose_engine, installed_engines, plan
from providers.kinds.pool.pool import Pool
from providers.kinds.pool.settings import PoolSettings
from providers.kinds.pool.sources import SourceError, Weights, default_cache_dir, resolve


class PoolUnavailable(Exception):
    """The pool cannot run on this machine; the message is the one log line saying why."""


async def build_pool(name: str, settings: PoolSettings, transport: Transport, link: Link,
                     key: Secret | None = None) -> Pool:
    """A started pool, checking its workers through `transport` over `link` (with `key`, the
    workers' own, when they want one); PoolUnavailable when it has nothing to run and no
    remote workers."""
    log = get_logger().bind(pool=name)
    host = installed_engines(gpus.select(await gpus.discover(), "all"))
    spawns = any(model.source for model in settings.models.values())
    engine: str | None = None
    plans = []
    try:
        if spawns:
            engine = choose_engine(settings.engine, host)
            cache = _cache_dir(settings)
            weights: dict[str, Weights] = {}
            for alias, model in settings.models.items():
                if model.source:
                    weights[alias] = await resolve(model.source, cache)
            plans = plan(name, settings, engine, host, weights)
    except (ValueError, SourceError) as exc:
        if not settings.workers:
            raise PoolUnavailable(f"pool cannot start: {exc}") from exc
        log.warning("pool_spawns_nothing", reason=str(exc), remote_workers=len(settings.workers))
        engine, plans = None, []
    pool = Pool(name, settings, transport, link, plans, engine, key=key)
    await pool.start()
    log.info("pool_started", engine=engine, gpus=list(host.gpus),
             workers=[p.name for p in plans], remote=list(settings.workers))
    return pool


def _cache_dir(settings: PoolSettings) -> Path:
    return Path(settings.cache_dir).expanduser() if settings.cache_dir else default_cache_dir()
