"""A fake OpenAI-compatible upstream on a real socket, with the faults real providers have.

It runs an aiohttp server in a daemon thread with its own event loop, so synchronous tests can
drive it. Each POST consumes the next queued `Mode` (the last one repeats); every request is
recorded so tests can assert exactly what the gateway forwarded.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

REASONS = {400: "invalid_request_error", 404: "invalid_request_error",
           401: "authentication_error", 403: "authentication_error", 429: "rate_limit_error"}


@dataclass(frozen=True)
class Mode:
    """How the fake answers one request."""

    kind: str
    code: int = 200
    content: str | None = None
    chunks: tuple[str, ...] | None = None
    delay_between_chunks: float = 0.0
    reasoning: str | None = None
    finish_reason: str = "stop"
    usage: bool = True
    message: str | None = None
    retry_after: float | str | None = None
    body: bytes | None = None
    seconds: float = 0.0
    after_chunks: int = 2
    then: Mode | None = None
    options: tuple[Mode, ...] = ()
    seed: int = 0
    tool: tuple[str, str] | None = None  # (function name, JSON arguments)


def ok(content: str | None = None, chunks: list[str] | None = None,
       delay_between_chunks: float = 0.0, reasoning: str | None = None,
       finish_reason: str = "stop", usage: bool = True) -> Mode:
    """Answer successfully (streamed when the request asks for it)."""
    return Mode("ok", content=content, chunks=tuple(chunks) if chunks else None,
                delay_between_chunks=delay_between_chunks, reasoning=reasoning,
                finish_reason=finish_reason, usage=usage)


def tool_call(name: str, arguments: str, content: str = "", reasoning: str | None = None) -> Mode:
    """Answer with a call of function `name` (streamed as deltas when asked to stream)."""
    return Mode("ok", content=content, chunks=tuple(_words(content)) if content else ("",),
                reasoning=reasoning, finish_reason="tool_calls", tool=(name, arguments))


def status(code: int, message: str | None = None, retry_after: float | str | None = None,
           body: bytes | str | None = None) -> Mode:
    """Answer with this HTTP status and an OpenAI error envelope (or `body` verbatim)."""
    raw = body.encode() if isinstance(body, str) else body
    return Mode("status", code=code, message=message, retry_after=retry_after, body=raw)


def hang() -> Mode:
    """Accept the request and never answer."""
    return Mode("hang")


def slow_first_token(seconds: float, then: Mode | None = None) -> Mode:
    """Send nothing for `seconds`, then behave like `then` (default: ok)."""
    return Mode("slow", seconds=seconds, then=then or ok())


def stream_cut(after_chunks: int = 2) -> Mode:
    """Start answering, then drop the connection without finishing."""
    return Mode("cut", after_chunks=after_chunks)


def chaos(*options: Mode, seed: int = 0) -> Mode:
    """Each request gets one of `options` at random (repeatably, from `seed`)."""
    return Mode("chaos", options=options, seed=seed)


def invalid_json() -> Mode:
    """200 with a body that is not JSON."""
    return Mode("invalid_json")


def sse_garbage() -> Mode:
    """200 text/event-stream whose body is not SSE (non-streaming: like invalid_json)."""
    return Mode("sse_garbage")


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refusing_url() -> str:
    """A base URL whose connections are refused."""
    return f"http://127.0.0.1:{free_port()}/v1"


def _words(text: str) -> list[str]:
    pieces = text.split(" ")
    return [pieces[0]] + [f" {p}" for p in pieces[1:]]


@dataclass
class FakeUpstream:
    """The fake server; `start()` it, point a provider at `base_url`, `stop()` it."""

    name: str = "upstream"
    models: tuple[str, ...] = ()
    requests: list[Recorded] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._modes: list[Mode] = [ok()]
        self._rng: random.Random | None = None
        self._lock = threading.Lock()
        self._cancelled = 0
        self._cancel_event = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # -- control, from the test's thread ------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def last_json(self) -> Any:
        return self.requests[-1].json if self.requests else None

    @property
    def cancelled(self) -> int:
        return self._cancelled

    def set_mode(self, *modes: Mode) -> None:
        with self._lock:
            self._modes = list(modes) or [ok()]

    def reset(self) -> None:
        with self._lock:
            self._modes = [ok()]
            self.requests.clear()
            self._cancelled = 0
            self._cancel_event.clear()

    def wait_for_cancel(self, timeout: float = 5.0) -> bool:
        return self._cancel_event.wait(timeout)

    def start(self) -> FakeUpstream:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True,
                                        name=f"fake-{self.name}")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake upstream did not start")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeUpstream:
        return self if self._loop else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server, in its own thread ----------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._list_models)
        # Cancel handlers when the client leaves, so the fake can count abandoned requests.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     handler_cancellation=True)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port or 0)
        self._loop.run_until_complete(site.start())
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _next_mode(self) -> Mode:
        with self._lock:
            mode = self._modes.pop(0) if len(self._modes) > 1 else self._modes[0]
            if mode.kind == "chaos":
                if self._rng is None:
                    self._rng = random.Random(mode.seed)
                mode = self._rng.choice(mode.options)
            return mode

    def _mark_cancelled(self) -> None:
        self._cancelled += 1
        self._cancel_event.set()

    async def _record(self, request: web.Request) -> Any:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        self.requests.append(Recorded(request.method, request.path,
                                      {k.lower(): v for k, v in request.headers.items()},
                                      body, parsed))
        return parsed

    async def _list_models(self, request: web.Request) -> web.Response:
        await self._record(request)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": self.name}
                for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _ChatShape())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _CompletionShape())

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _ResponsesShape())

    async def _answer(self, request: web.Request, shape: _Shape) -> web.StreamResponse:
        body = await self._record(request)
        if not isinstance(body, dict):
            return _error(400, "request body is not JSON")
        mode = self._next_mode()
        try:
            return await self._play(request, mode, body, shape)
        except (asyncio.CancelledError, ConnectionResetError):
            self._mark_cancelled()
            raise

    async def _play(self, request: web.Request, mode: Mode, body: dict[str, Any],
                    shape: _Shape) -> web.StreamResponse:
        if mode.kind == "slow":
            await asyncio.sleep(mode.seconds)
            assert mode.then is not None
            return await self._play(request, mode.then, body, shape)
        if mode.kind == "hang":
            await asyncio.sleep(3600)
        if mode.kind == "status":
            return _error(mode.code, mode.message, mode.retry_after, mode.body)
        if mode.kind == "invalid_json" or (mode.kind == "sse_garbage" and not body.get("stream")):
            return web.Response(body=b'{"id": "x", "choices": [', content_type="application/json")
        if mode.kind == "sse_garbage":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"<html>oops</html>\n\n")
            await response.write_eof()
            return response
        content = mode.content or f"Hello from {self.name}"
        pieces = list(mode.chunks) if mode.chunks else _words(content)
        if body.get("stream"):
            return await self._stream(request, mode, body, shape, pieces)
        if mode.kind == "cut":
            return await _cut_json(request)
        return web.json_response(shape.whole(body, "".join(pieces), mode, len(pieces)))

    async def _stream(self, request: web.Request, mode: Mode, body: dict[str, Any],
                      shape: _Shape, pieces: list[str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = shape.events(body, pieces, mode)
        limit = 1 + mode.after_chunks if mode.kind == "cut" else len(events)
        for number, event in enumerate(events[:limit]):
            if number and mode.delay_between_chunks:
                await asyncio.sleep(mode.delay_between_chunks)
            # Responses API streams name each event; chat streams do not.
            named = f"event: {event['type']}\n".encode() if "type" in event else b""
            await response.write(named + b"data: " + json.dumps(event).encode() + b"\n\n")
        if mode.kind == "cut":
            assert request.transport is not None
            request.transport.abort()
            return response
        if not isinstance(shape, _ResponsesShape):  # a Responses stream ends without [DONE]
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _error(code: int, message: str | None = None, retry_after: float | str | None = None,
           body: bytes | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if body is None:
        envelope = {"error": {"message": message or f"fake {code}",
                              "type": REASONS.get(code, "server_error"), "code": None,
                              "param": None}}
        body = json.dumps(envelope).encode()
    return web.Response(status=code, body=body, headers=headers, content_type="application/json")


async def _cut_json(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json",
                                           "Content-Length": "1000"})
    await response.prepare(request)
    await response.write(b'{"id": "chatcmpl-cut", "choices": [')
    assert request.transport is not None
    request.transport.abort()
    return response


def _usage(body: dict[str, Any], completion_tokens: int) -> dict[str, int]:
    text = json.dumps(body.get("messages") or body.get("prompt") or body.get("input") or "")
    prompt_tokens = max(1, len(text.split()))
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _Shape:
    """How one endpoint's answers look; subclasses per endpoint."""

    def whole(self, body: dict[str, Any], text: str, mode: Mode, pieces: int) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        raise NotImplementedError


class _ChatShape(_Shape):
    def whole(self, body: dict[str, Any], text: str, mode: Mode, pieces: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text or None,
                                   "refusal": None}
        if mode.reasoning:
            message["reasoning_content"] = mode.reasoning
        if mode.tool:
            message["tool_calls"] = [{"id": "call_1", "type": "function",
                                      "function": {"name": mode.tool[0],
                                                   "arguments": mode.tool[1]}}]
        choices = [{"index": i, "message": message, "logprobs": None,
                    "finish_reason": mode.finish_reason} for i in range(body.get("n") or 1)]
        answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                  "model": body.get("model"), "choices": choices}
        if mode.usage:
            answer["usage"] = _usage(body, pieces)
        return answer

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                 "finish_reason": finish}]}

        events = [chunk({"role": "assistant", "content": ""})]
        if mode.reasoning:
            events.append(chunk({"reasoning_content": mode.reasoning}))
        events += [chunk({"content": piece}) for piece in pieces if piece]
        if mode.tool:
            name, arguments = mode.tool
            third = max(1, len(arguments) // 3)
            events.append(chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                 "function": {"name": name, "arguments": ""}}]}))
            events += [chunk({"tool_calls": [{"index": 0, "function": {
                "arguments": arguments[i:i + third]}}]})
                for i in range(0, len(arguments), third)]
        events.append(chunk({}, mode.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**chunk({}), "choices": [], "usage": _usage(body, len(pieces))})
        return events


class _CompletionShape(_Shape):
    def whole(self, body: dict[str, Any], text: str, mode: Mode, pieces: int) -> dict[str, Any]:
        prompts = body.get("prompt")
        prompts = prompts if isinstance(prompts, list) and prompts and isinstance(prompts[0], str) \
            else [prompts if isinstance(prompts, str) else ""]
        choices = []
        for prompt in prompts:
            for _ in range(body.get("n") or 1):
                full = (prompt + text) if body.get("echo") else text
                choices.append({"text": full, "index": len(choices),
                                "logprobs": _logprobs(_words(text)) if body.get("logprobs")
                                else None,
                                "finish_reason": mode.finish_reason})
        answer = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
                  "model": body.get("model"), "choices": choices}
        if mode.usage:
            answer["usage"] = _usage(body, pieces)
        return answer

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
            return {"id": "cmpl-fake", "object": "text_completion", "created": 1,
                    "model": body.get("model"),
                    "choices": [{"text": text, "index": 0, "logprobs": None,
                                 "finish_reason": finish}]}

        return [chunk(""), *(chunk(piece) for piece in pieces), chunk("", mode.finish_reason)]


def _logprobs(pieces: list[str]) -> dict[str, Any]:
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {"tokens": pieces, "token_logprobs": [-0.1] * len(pieces),
            "top_logprobs": [{piece: -0.1} for piece in pieces], "text_offset": offsets}


class _ResponsesShape(_Shape):
    def whole(self, body: dict[str, Any], text: str, mode: Mode, pieces: int) -> dict[str, Any]:
        return {"id": "resp_fake", "object": "response", "created_at": int(time.time()),
                "status": "completed", "model": body.get("model"), "tools": [],
                "tool_choice": "auto", "parallel_tool_calls": True,
                "output": [{"type": "message", "id": "msg_fake", "status": "completed",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": text,
                                         "annotations": []}]}],
                "usage": {"input_tokens": 3, "output_tokens": pieces,
                          "total_tokens": 3 + pieces}}

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        final = self.whole(body, "".join(pieces), mode, len(pieces))
        opening = {**final, "status": "in_progress", "output": [], "usage": None}
        item = {**final["output"][0], "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": opening},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.content_part.added", "item_id": item["id"], "output_index": 0,
             "content_index": 0, "part": part}]
        events += [{"type": "response.output_text.delta", "item_id": item["id"],
                    "output_index": 0, "content_index": 0, "delta": piece, "logprobs": []}
                   for piece in pieces]
        events += [{"type": "response.output_text.done", "item_id": item["id"],
                    "output_index": 0, "content_index": 0, "text": "".join(pieces),
                    "logprobs": []},
                   {"type": "response.output_item.done", "output_index": 0,
                    "item": final["output"][0]},
                   {"type": "response.completed", "response": final}]
        for number, event in enumerate(events):
            event["sequence_number"] = number
        return events
