"""A fake Realtime API upstream: OpenAI's `/v1/realtime` WebSocket (and Azure's
`/openai/realtime`), speaking enough of the protocol for a session.

On connect it sends `session.created`; `session.update` is answered `session.updated`;
`input_audio_buffer.append` adds its audio to the buffer; `response.create` is answered
`response.created`, the text deltas of `TEXT`, the buffered audio back as audio deltas (in
`AUDIO_CHUNK`-byte pieces of base64, or one delta of `AUDIO` when nothing was appended), and
`response.done` with `usage` (settable). GA event names are used, the beta's
(`response.text.delta`, `response.audio.delta`) for a client that sent `OpenAI-Beta:
realtime=v1`. It records each handshake's `Authorization` / `api-key`, `OpenAI-Beta` and query,
and the frames it got.

Modes, for the next handshakes (the last one repeats): `ok`, `refuse` (a 503 to the upgrade),
`hang` (the upgrade never answered), `drop` (the TCP connection cut after `after` frames from
the client, no close frame).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

TEXT = ["Hel", "lo, ", "wor", "ld!"]
AUDIO = b"\x00\x01" * 800
AUDIO_CHUNK = 48 * 1024  # raw bytes per audio delta (base64 makes it a third larger)
USAGE: dict[str, Any] = {
    "total_tokens": 200, "input_tokens": 120, "output_tokens": 80,
    "input_token_details": {"text_tokens": 20, "audio_tokens": 100, "cached_tokens": 10,
                            "cached_tokens_details": {"text_tokens": 10, "audio_tokens": 0}},
    "output_token_details": {"text_tokens": 30, "audio_tokens": 50}}


@dataclass(frozen=True)
class Handshake:
    """What one upgrade request carried."""

    path: str
    query: dict[str, str]
    authorization: str | None
    api_key: str | None
    beta: str | None


@dataclass
class FakeRealtime:
    """The fake server; `start()` it, point a provider at `base_url`, `stop()` it."""

    name: str = "realtime"
    usage: dict[str, Any] = field(default_factory=lambda: dict(USAGE))
    handshakes: list[Handshake] = field(default_factory=list, init=False)
    received: list[str] = field(default_factory=list, init=False)  # client event types
    port: int = 0

    def __post_init__(self) -> None:
        self._modes: list[tuple[str, int]] = [("ok", 0)]
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.sessions = 0  # sessions open now
        self.pages: dict[str, str] = {}  # path: HTML, for a browser's page

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_mode(self, *modes: str, after: int = 0) -> None:
        with self._lock:
            self._modes = [(mode, after) for mode in modes] or [("ok", 0)]

    def reset(self) -> None:
        with self._lock:
            self._modes = [("ok", 0)]
            self.handshakes.clear()
            self.received.clear()

    def _next_mode(self) -> tuple[str, int]:
        with self._lock:
            return self._modes.pop(0) if len(self._modes) > 1 else self._modes[0]

    def start(self) -> FakeRealtime:
        sock = socket.create_server(("127.0.0.1", self.port))
        self.port = int(sock.getsockname()[1])
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(sock, ready)),
                                        daemon=True, name=f"fake-{self.name}")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake Realtime server did not start")
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._thread = None

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/realtime", self._session)
        app.router.add_get("/openai/realtime", self._session)
        app.router.add_get("/page/{name}", self._page)
        runner = web.AppRunner(app, handle_signals=False, access_log=None,
                               shutdown_timeout=1.0)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=self.pages[request.match_info["name"]],
                            content_type="text/html")

    async def _session(self, request: web.Request) -> web.StreamResponse:
        headers = request.headers
        self.handshakes.append(Handshake(request.path, dict(request.query),
                                         headers.get("Authorization"), headers.get("api-key"),
                                         headers.get("OpenAI-Beta")))
        mode, after = self._next_mode()
        if mode == "refuse":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if mode == "hang":
            await asyncio.sleep(3600)
        ws = web.WebSocketResponse(max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        self.sessions += 1
        try:
            await self._speak(ws, request, beta=headers.get("OpenAI-Beta") is not None,
                              drop_after=after if mode == "drop" else None)
        finally:
            self.sessions -= 1
        return ws

    async def _speak(self, ws: web.WebSocketResponse, request: web.Request, beta: bool,
                     drop_after: int | None) -> None:
        await ws.send_json({"type": "session.created", "event_id": "event_1",
                            "session": {"id": "sess_1", "object": "realtime.session"}})
        audio = bytearray()
        frames = 0
        async for message in ws:
            if message.type is not WSMsgType.TEXT:
                continue
            frames += 1
            if drop_after is not None and frames >= drop_after:
                assert request.transport is not None
                request.transport.abort()  # no close frame: a dropped connection
                return
            event = json.loads(message.data)
            kind = event.get("type", "")
            self.received.append(kind)
            if kind == "session.update":
                await ws.send_json({"type": "session.updated", "event_id": "event_2",
                                    "session": event.get("session", {})})
            elif kind == "input_audio_buffer.append":
                audio += base64.b64decode(event["audio"])
            elif kind == "response.create":
                await self._respond(ws, bytes(audio) or AUDIO, beta)
                audio.clear()

    async def _respond(self, ws: web.WebSocketResponse, audio: bytes, beta: bool) -> None:
        response = {"id": "resp_1", "object": "realtime.response", "status": "in_progress",
                    "output": []}
        await ws.send_json({"type": "response.created", "event_id": "e", "response": response})
        text_delta = "response.text.delta" if beta else "response.output_text.delta"
        audio_delta = "response.audio.delta" if beta else "response.output_audio.delta"
        where = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0,
                 "content_index": 0}
        for piece in TEXT:
            await ws.send_json({"type": text_delta, "event_id": "e", **where, "delta": piece})
        for start in range(0, len(audio), AUDIO_CHUNK):
            chunk = base64.b64encode(audio[start:start + AUDIO_CHUNK]).decode()
            await ws.send_json({"type": audio_delta, "event_id": "e", **where, "delta": chunk})
        await ws.send_json({"type": "response.done", "event_id": "e", "response": {
            **response, "status": "completed", "usage": self.usage}})
