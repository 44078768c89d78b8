"""Serve two requests through the app in-process over httpx's ASGI transport, print the answers.

Run as a script by tests/test_fastpath.py, in a process of its own: the app configures logging
for its whole process. Under an ASGI server other than uvicorn the relay cannot write to the
transport itself, so this takes the fallback path through Litestar's responses.
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
            transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        whole = await client.post("/v1/chat/completions", json=body)
        streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
    print(json.dumps([{"status": r.status_code, "headers": dict(r.headers), "text": r.text}
                      for r in (whole, streamed)]))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
