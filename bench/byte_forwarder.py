"""The socket floor: bytes from each client connection to an upstream connection of its own and
back, unparsed, on uvloop. What any process in the path costs on this machine before it reads a
byte of HTTP: two more socket hops, each a wake-up of the core it is pinned to.

Measured beside the gateway at a steady 500 req/s (`scenarios.latency_at_rate`): its added p50
is what an absolute latency target has to leave room for on the machine of the run.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

import uvloop


class Upstream(asyncio.Protocol):
    """The upstream side of one client's pair: answers go straight back to the client."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class Client(asyncio.Protocol):
    """A client connection; its upstream connection opens with it, reads wait until it has."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstream: asyncio.Transport | None = None
        self.connecting: asyncio.Task[None] | None = None  # held: the loop keeps weak refs

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.pause_reading()
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        try:
            upstream, _ = await asyncio.get_running_loop().create_connection(
                lambda: Upstream(self.transport), self.host, self.port)
        except OSError:
            self.transport.close()
            return
        self.upstream = cast(asyncio.Transport, upstream)
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        assert self.upstream is not None  # reading only once it is there
        self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client("127.0.0.1", upstream_port),
                                      "127.0.0.1", port, backlog=4096)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
