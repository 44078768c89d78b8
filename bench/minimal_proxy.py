"""The floor a Python gateway can reach: aiohttp in, one aiohttp session out, bytes through.

A streamed answer (`text/event-stream` upstream) is relayed read by read as it arrives.
"""

from __future__ import annotations

import argparse

import aiohttp
import uvloop
from aiohttp import web


def make_app(upstream: str) -> web.Application:
    app = web.Application()

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            app["session"] = session
            yield

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with request.app["session"].post(
                f"{upstream}/chat/completions", data=body,
                headers={"Content-Type": "application/json"}) as response:
            if response.content_type == "text/event-stream":
                out = web.StreamResponse(status=response.status,
                                         headers={"Content-Type": "text/event-stream"})
                await out.prepare(request)
                async for data in response.content.iter_any():
                    await out.write(data)
                await out.write_eof()
                return out
            payload = await response.read()
            return web.Response(body=payload, status=response.status,
                                content_type="application/json")

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", relay)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL ending in /v1")
    args = parser.parse_args()
    uvloop.install()
    web.run_app(make_app(args.upstream), host="127.0.0.1", port=args.port, access_log=None,
                print=None)


if __name__ == "__main__":
    main()
