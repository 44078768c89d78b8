"""A throwaway redis-server on a free loopback port, which tests may kill and restart."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import time

import httpx
import redis

from tests.gateway_process import GatewayProcess, dies_with_us
from tests.upstream import free_port
from tests.waiting import wait_until


class RedisServer:
    """`redis-server` with no persistence; `stop()` kills it, `start()` brings it back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=dies_with_us)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def synced(self, gateway: GatewayProcess, key: str | None = None,
               prefix: str = "llms-gateway:") -> None:
        """Return once `gateway` has run a whole sync with this Redis that began after the
        call: what it had to share is written, what the others shared is read.

        Nothing a gateway serves says when it synced, so markers do: a cooldown for a provider
        no config names, put in the shared health hash, shows in the gateway's /ready (asked
        with `key` when the gateway has keys) once a sync has read it. A sync reads that hash
        first, then shares counts and latencies: the sync that shows the first marker did all
        of that after the call, and it has ended once a later sync shows a second marker."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}

        def read_by_a_sync() -> None:
            marker = f"sync-marker-{secrets.token_hex(4)}"
            client.hset(f"{prefix}health", f"{marker}\x1f", json.dumps([time.time() + 30, 0]))

            def shown() -> bool:
                ready = httpx.get(f"{gateway.url}/ready", headers=headers, timeout=5).json()
                return any(c["provider"] == marker for c in ready["circuits"])

            wait_until(shown, within=5, what=f"{gateway.url} reading {marker} from Redis")
            client.hdel(f"{prefix}health", f"{marker}\x1f")  # read: Redis is as it was

        client = redis.Redis.from_url(self.url)
        try:
            read_by_a_sync()  # by a sync that then shares the rest, after the call
            read_by_a_sync()  # by a later one: that sync has ended
        finally:
            client.close()
