"""The minimal Litestar + aiohttp proxy: one route relaying bytes through one aiohttp session.

What the gateway's framework and server cost without the gateway: served by granian with the
gateway's own settings (`gateway.edge.serving.run`, the same limits and worker setup), or by
uvicorn (httptools, uvloop). Whole answers only, as the throughput part asks.

    python bench/litestar_proxy.py --port N --upstream URL --server granian|uvicorn
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator

import aiohttp
from litestar import Litestar, Request, Response, post

UPSTREAM_ENV = "LITESTAR_PROXY_UPSTREAM"


def create_app() -> Litestar:
    """The proxy, its upstream read from the environment (a factory takes no arguments)."""
    upstream = os.environ[UPSTREAM_ENV]
    sessions: list[aiohttp.ClientSession] = []

    @contextlib.asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            sessions.append(session)
            yield

    @post("/v1/chat/completions", status_code=200)
    async def relay(request: Request) -> Response[bytes]:  # type: ignore[type-arg]
        body = await request.body()
        async with sessions[0].post(f"{upstream}/chat/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as answer:
            content = await answer.read()
            return Response(content, status_code=answer.status,
                            media_type=answer.content_type)

    return Litestar([relay], lifespan=[lifespan], debug=False, openapi_config=None,
                    logging_config=None, request_max_body_size=4 * 1024 * 1024)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--server", choices=("granian", "uvicorn"), default="granian")
    args = parser.parse_args()
    os.environ[UPSTREAM_ENV] = args.upstream
    if args.server == "uvicorn":
        import uvicorn

        uvicorn.run("litestar_proxy:create_app", factory=True, host="127.0.0.1",
                    port=args.port, loop="uvloop", http="httptools", access_log=False,
                    log_level="warning")
        return
    from gateway.core.settings import ServerConfig
    from gateway.edge.serving import run

    run(ServerConfig(), "127.0.0.1", args.port, 1, 65536, app="litestar_proxy:create_app")


if __name__ == "__main__":
    main()
