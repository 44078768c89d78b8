"""Which gateway process spawns a pool's workers: the one holding the pool's lock file.

With several gateway processes (`--workers N`) every one builds the pool, but only the first to
lock the file spawns; the kernel drops the lock when its holder dies, so another takes over.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path


class LeaderLock:
    """An exclusive, non-blocking file lock; the kernel drops it when its process dies."""

    def __init__(self, key: str, folder: Path | None = None) -> None:
        """`folder`: the gateway's state folder, so that only its own processes contend;
        without one, the system's temporary folder."""
        folder = folder or Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"llms-gateway-pool-{key}.lock"
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Whether this process holds the lock now (taking it if it is free)."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Let another process take the lock (the pool stopped)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
