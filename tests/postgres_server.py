"""A throwaway PostgreSQL server on a free loopback port, in a temporary directory, which tests
may stop and start again (the data stays).

PostgreSQL refuses to run as root: as root (CI) the server runs as the `postgres` user, which
owns the directory.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.gateway_process import dies_with_us
from tests.upstream import free_port

USER = "gateway"


def _as_owner() -> list[str]:
    if os.geteuid() != 0:
        return []
    # setpriv execs the command in its own process: signals reach the server itself.
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


class PostgresServer:
    """`initdb` once, then `postgres` started and stopped at will; `close()` removes it all.
    With a password, every connection must give it (as the official image's server wants)."""

    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="llms-gateway-pg-"))
        self.data = self.root / "data"
        login = f"{USER}:{password}" if password else USER
        self.url = f"postgresql://{login}@127.0.0.1:{self.port}/{USER}"
        self.env = {**os.environ, "PGPASSWORD": password} if password else None
        self.process: subprocess.Popen[bytes] | None = None
        self.created = False
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        auth = ["-A", "trust"]
        if password:
            (self.root / "password").write_text(password)
            os.chmod(self.root / "password", 0o644)  # read by initdb as the postgres user
            auth = ["-A", "scram-sha-256", f"--pwfile={self.root / 'password'}"]
        subprocess.run([*_as_owner(), "initdb", "-D", str(self.data), "-U", USER, *auth,
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True)

    @staticmethod
    def available() -> bool:
        if shutil.which("initdb") is None or shutil.which("postgres") is None:
            return False
        if os.geteuid() != 0:
            return True
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return False
        return shutil.which("setpriv") is not None

    def start(self) -> PostgresServer:
        self.process = subprocess.Popen(
            [*_as_owner(), "postgres", "-D", str(self.data), "-p", str(self.port),
             "-k", str(self.root), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "max_connections=200"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=dies_with_us)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", str(self.port)],
                                   capture_output=True)
            if ready.returncode == 0:
                if not self.created:
                    subprocess.run(["createdb", "-h", "127.0.0.1", "-p", str(self.port),
                                    "-U", USER, USER], check=True, capture_output=True,
                                   env=self.env)
                    self.created = True
                return self
            time.sleep(0.1)
        raise RuntimeError("postgres did not start")

    def database(self, name: str) -> str:
        """A new, empty database on this server; its URL."""
        subprocess.run(["createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name],
                       check=True, capture_output=True)
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        """A fast shutdown (SIGINT): connections are cut, as when the database goes down."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=30)
        with socket.socket() as sock:  # the port is free again once it answers no more
            assert sock.connect_ex(("127.0.0.1", self.port)) != 0

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
