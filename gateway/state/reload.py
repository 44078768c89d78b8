"""Hot reload: poll the config file (or hear SIGHUP) and apply a valid edit; keep the last good
config otherwise, and say why on the log and the status page.

A reload is refused, not applied, when it would weaken the gateway (`config.weakening`): keys
that resolve to none while keys are in force, an open reachable bind, no provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from gateway import config
from gateway.config.loader import BIND_ENV, OPEN_ENV
from gateway.core.settings import ConfigError
from gateway.state.runtime import Runtime
from providers.contract.log import get_logger


def _stamp(path: Path) -> tuple[int, int, int] | None:
    # Editors that save by rename change the inode; others change mtime or size.
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


CONFIG_FILE = "config_file"  # the actor of a reload in the audit log: whoever edited the file


async def watch(path: Path, interval: float, runtime: Runtime, now: asyncio.Event) -> None:
    """Poll `path` every `interval` seconds and reload it whenever it changes, or at once when
    `now` is set (SIGHUP)."""
    last = _stamp(path)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(now.wait(), interval)
        forced = now.is_set()
        now.clear()
        stamp = _stamp(path)
        if stamp == last and not forced:
            continue
        last = stamp
        await reload_once(path, runtime)


async def reload_once(path: Path, runtime: Runtime) -> bool:
    """Load `path` off the event loop and apply it unless it is invalid or would weaken the
    gateway; True when applied. The outcome is logged and kept for `/status.json`."""
    log = get_logger()
    try:
        snapshot = await asyncio.to_thread(config.load, path)
        bind = os.environ.get(BIND_ENV) or snapshot.server.host
        if (why := config.weakening(runtime.live.snapshot, snapshot, bind,
                                    allowed_open=os.environ.get(OPEN_ENV) == "1")) is not None:
            raise ConfigError(f"{path}: reload refused: {why}")
        await runtime.apply(snapshot)
    except ConfigError as exc:
        log.error("config_reload_failed", file=str(path), error=str(exc),
                  action="keeping the last good config")
        runtime.config_error = {"error": str(exc), "at": time.time()}
        return False
    runtime.config_error = None
    order = [p.name for p in snapshot.providers if p.enabled]
    log.info("config_reloaded", file=str(path), providers=order)
    if runtime.accounts is not None:
        await runtime.accounts.audit(CONFIG_FILE, "config_reloaded", str(path),
                                     {"providers": order})
    return True
