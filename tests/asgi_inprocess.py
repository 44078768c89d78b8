"""Serve requests through the app in-process over httpx's ASGI transport, print the answers.

Run as a script by tests/test_front.py, in a process of its own (the app configures logging for
its whole process): the relay speaks plain ASGI, so a server that is not the one `gateway serve`
runs, here httpx's in-process transport, gets the same answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx

from gateway import config
from gateway.app import create_app, lifespan


async def main(config_path: str) -> None:
    app = create_app(config.load(Path(config_path)))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with lifespan(app.app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
        whole = await client.post("/v1/chat/completions", json=body)
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
        wrong_method = await client.get("/v1/chat/completions")
        inflight = app.app.state.runtime.inflight
    print(json.dumps({"answers": [{"status": r.status_code, "headers": dict(r.headers),
                                   "text": r.text} for r in (whole, streamed, wrong_method)],
                      "inflight": inflight}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
