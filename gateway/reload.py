"""Hot reload: poll the config file and apply a valid edit; keep the last good config otherwise."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway import config
from gateway.config import ConfigError, Snapshot
from providers.contract.log import get_logger


def _stamp(path: Path) -> tuple[int, int, int] | None:
    # Editors that save by rename change the inode; others change mtime or size.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


async def watch(path: Path, interval: float, apply: Callable[[Snapshot], Awaitable[None]]) -> None:
    """Poll `path` every `interval` seconds; load and apply it whenever it changes."""
    log = get_logger()
    last = _stamp(path)
    while True:
        await asyncio.sleep(interval)
        stamp = _stamp(path)
        if stamp == last:
            continue
        last = stamp
        try:
            snapshot = config.load(path)
            await apply(snapshot)
        except ConfigError as exc:
            log.error("config_reload_failed", file=str(path), error=str(exc),
                      action="keeping the last good config")
            continue
        order = [p.name for p in snapshot.providers if p.enabled]
        log.info("config_reloaded", file=str(path), providers=order)
