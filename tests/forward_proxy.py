"""A real forward proxy for tests: CONNECT tunnels (https) and absolute-form requests (http).

Like the fake upstreams it serves from a daemon thread with its own event loop, on loopback. It
records what it relayed (method, target, the Proxy-Authorization it got) and, given
credentials, answers 407 to a request without them, as a corporate proxy does. Host names in
`hosts` resolve to the addresses given there, so a test can name an upstream only the proxy can
find.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Relayed:
    """One request the proxy took: CONNECT host:port, or an absolute-form http request."""

    method: str
    target: str
    proxy_authorization: str | None
    forwarded_head: bytes = b""  # absolute-form only: the head as the origin received it


@dataclass
class ForwardProxy:
    """`start()` it, point HTTP(S)_PROXY or a provider's "proxy" at `url`, `stop()` it."""

    credentials: tuple[str, str] | None = None  # (user, password) required, or anyone may use it
    hosts: dict[str, str] = field(default_factory=dict)
    relayed: list[Relayed] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        """The proxy's URL carrying credentials, as users write it in llms.json."""
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def start(self) -> ForwardProxy:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        loop = self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True, name="proxy")
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, sock=sock), loop).result(5)
        return self

    def stop(self) -> None:
        """Close the listener and every tunnel, then the loop."""
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        asyncio.run_coroutine_threadsafe(_shut(server), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        loop.close()
        self._loop = self._server = self._thread = None

    def __enter__(self) -> ForwardProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the proxy, on its own loop ----------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _ = request_line.split(" ", 2)
        headers = dict(line.split(":", 1) for line in header_lines if ":" in line)
        auth = next((v.strip() for k, v in headers.items()
                     if k.strip().lower() == "proxy-authorization"), None)
        if not self._authorized(auth):
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                         b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n'
                         b"Connection: close\r\n\r\n")
            await self._close(writer)
            return
        if method == "CONNECT":
            self._record(Relayed(method, target, auth))
            await self._tunnel(target, reader, writer)
        else:
            await self._forward(method, target, header_lines, auth, reader, writer)

    def _authorized(self, auth: str | None) -> bool:
        if self.credentials is None:
            return True
        user, password = self.credentials
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        return auth == expected

    def _record(self, relayed: Relayed) -> None:
        with self._lock:
            self.relayed.append(relayed)

    async def _open(self, host: str, port: int) -> tuple[asyncio.StreamReader,
                                                         asyncio.StreamWriter]:
        return await asyncio.open_connection(self.hosts.get(host, host), port)

    async def _tunnel(self, target: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        host, _, port = target.rpartition(":")
        try:
            upstream_reader, upstream_writer = await self._open(host.strip("[]"), int(port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await self._close(writer)
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await self._pipe_both(reader, writer, upstream_reader, upstream_writer)

    async def _forward(self, method: str, target: str, header_lines: list[str],
                       auth: str | None, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        parts = urlsplit(target)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        # What a proxy must not pass on (RFC 9110 7.6.1), and one request per connection:
        # the answer is piped back as it is, so the next request must come on a new one.
        kept = [line for line in header_lines if line and line.split(":", 1)[0].strip().lower()
                not in ("proxy-authorization", "proxy-connection", "connection", "keep-alive")]
        forwarded = "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close",
                                 "", ""]).encode("latin-1")
        self._record(Relayed(method, target, auth, forwarded))
        try:
            upstream_reader, upstream_writer = await self._open(parts.hostname or "",
                                                                parts.port or 80)
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await self._close(writer)
            return
        upstream_writer.write(forwarded)
        await self._pipe_both(reader, writer, upstream_reader, upstream_writer)

    async def _pipe_both(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         upstream_reader: asyncio.StreamReader,
                         upstream_writer: asyncio.StreamWriter) -> None:
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    @staticmethod
    async def _close(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def _shut(server: asyncio.AbstractServer) -> None:
    server.close()
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        sink.close()
