"""A fake OpenAI-compatible upstream on a real socket, with the faults real providers have.

It runs an aiohttp server in a daemon thread with its own event loop, so synchronous tests can
drive it. Each POST consumes the next queued `Mode` (the last one repeats); every request is
recorded so tests can assert exactly what the gateway forwarded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import re
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

from aiohttp import web

from tests import fake_native

ERROR_TYPES = {400: "invalid_request_error", 404: "invalid_request_error",
               401: "authentication_error", 403: "authentication_error", 429: "rate_limit_error"}
NOT_JSON = b'{"id": "x", "choices": ['
DONE = b"data: [DONE]\n\n"
# OpenAI's endpoints besides chat the fake answers (`tests.fake_native`); uploads among them.
FORMS = ("images/edits", "audio/transcriptions", "audio/translations")
NATIVE = ("moderations", "rerank", "images/generations", "audio/speech", *FORMS)
MAX_CHOICES = 128  # a fuzzed `n` must not make the fake build millions of choices


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
    end_delay: float = 0.0  # seconds between a stream's last event and the end of its body


def ok(content: str | None = None, chunks: list[str] | None = None,
       delay_between_chunks: float = 0.0, reasoning: str | None = None,
       finish_reason: str = "stop", usage: bool = True, end_delay: float = 0.0) -> Mode:
    """Answer successfully (streamed when the request asks for it). A stream's body ends
    `end_delay` seconds after its last event: real servers (uvicorn under vLLM) send that end
    in a write of its own."""
    return Mode("ok", content=content, chunks=tuple(chunks) if chunks else None,
                delay_between_chunks=delay_between_chunks, reasoning=reasoning,
                finish_reason=finish_reason, usage=usage, end_delay=end_delay)


def tool_call(name: str, arguments: str, content: str = "", reasoning: str | None = None) -> Mode:
    """Answer with a call of function `name` (streamed as deltas when asked to stream)."""
    return Mode("ok", content=content, chunks=tuple(_words(content)) if content else ("",),
                reasoning=reasoning, finish_reason="tool_calls", tool=(name, arguments))


def echo_prompt(split_at: int = 0) -> Mode:
    """Answer with the text of the request's last message (its prompt, its input), streamed as
    two deltas split at `split_at`: what a provider saw of a prompt, read back by the client."""
    return Mode("echo_prompt", after_chunks=split_at)


def prompt_text(body: dict[str, Any]) -> str:
    """The text of a request's last message, prompt or input, as `echo_prompt` answers it."""
    last: Any = body.get("prompt") or body.get("input")
    if isinstance(body.get("messages"), list) and body["messages"]:
        last = body["messages"][-1].get("content")
    if isinstance(last, list):
        last = last[-1]
        last = last.get("text") or last.get("content") if isinstance(last, dict) else last
    return last if isinstance(last, str) else ""


def status(code: int, message: str | None = None, retry_after: float | str | None = None,
           body: bytes | str | None = None) -> Mode:
    """Answer with this HTTP status and an OpenAI error envelope (or `body` verbatim)."""
    raw = body.encode() if isinstance(body, str) else body
    return Mode("status", code=code, message=message, retry_after=retry_after, body=raw)


def echo_headers(code: int = 400, at: str = "whole") -> Mode:
    """Fail echoing every request header (a provider's credentials among them), as some
    upstreams' debug errors do: as an HTTP `code` error (`at="whole"`), or on a stream as its
    opening event (`at="open"`) or after one chunk (`at="mid"`)."""
    return Mode("echo", code=code, message=at)


def echoed(request: web.Request) -> str:
    """The request's headers as an echoing upstream quotes them."""
    return "; ".join(f"{name}={value}" for name, value in request.headers.items())


def hang() -> Mode:
    """Accept the request and never answer."""
    return Mode("hang")


def held(then: Mode | None = None) -> Mode:
    """Send nothing until the test calls `release()`, then behave like `then` (default: ok).
    Each request held is recorded on arrival, so `requests` is the order they started in."""
    return Mode("held", then=then or ok())


def held_mid() -> Mode:
    """Send an answer's first chunk (speech audio), then nothing until `release()`."""
    return Mode("held_mid")


def paused(after_events: int, content: str | None = None) -> Mode:
    """Stream an answer's first `after_events` events, then nothing until `release()`, then
    the rest (a whole answer: as `ok`)."""
    return Mode("paused", content=content, after_chunks=after_events)


def slow_first_token(seconds: float, then: Mode | None = None) -> Mode:
    """Send nothing (not even headers) for `seconds`, then behave like `then` (default: ok)."""
    return Mode("slow", seconds=seconds, then=then or ok())


def stream_cut(after_chunks: int = 2, whole: Mode | None = None) -> Mode:
    """Send the opening event and `after_chunks` more, then drop the connection; a request
    for a whole answer is answered as `whole` says, when given."""
    return Mode("cut", after_chunks=after_chunks, then=whole)


def chaos(*options: Mode, seed: int = 0) -> Mode:
    """Each request gets one of `options` at random (repeatably, from `seed`)."""
    return Mode("chaos", options=options, seed=seed)


def invalid_json() -> Mode:
    """200 application/json with a body that is not JSON."""
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
    peer: tuple[str, int] | None = None  # the client's end of the connection it came on


def whole_request_body(buffer: bytes) -> bytes | None:
    """For raw test servers: the body of the request in `buffer` once all of it (by its
    Content-Length) has arrived, else None."""
    head, found, body = buffer.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                   if line.startswith(b"content-length:")), 0)
    return body if found and len(body) >= length else None


Reply = Callable[[asyncio.Transport, bytes, int], None]


class Scripted(asyncio.Protocol):
    """A raw test server's connection: reads whole requests and lets `reply(transport, body,
    nth)` write exactly the bytes a test wants (`nth`: the request's number on this
    connection, from 1). Counts connections and requests in `counts`."""

    def __init__(self, reply: Reply, counts: dict[str, int]) -> None:
        self.reply, self.counts = reply, counts
        self.buffer = b""
        self.served = 0
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.counts["connections"] += 1

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        body = whole_request_body(self.buffer)
        if body is not None:
            self.buffer = b""
            self.served += 1
            self.counts["requests"] += 1
            self.reply(self.transport, body, self.served)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refusing_url() -> str:
    """A base URL whose connections are refused."""
    return f"http://127.0.0.1:{free_port()}/v1"


@dataclass
class FakeUpstream:
    """The fake server; `start()` it, point a provider at `base_url`, `stop()` it."""

    name: str = "upstream"
    models: tuple[str, ...] = ()
    port: int = 0  # 0: any free port; give the old one to restart in place
    tls: ssl.SSLContext | None = None  # serve HTTPS (as https://localhost) with this context
    requests: list[Recorded] = field(default_factory=list, init=False)
    # A final assistant message is continued as it is (Ollama's, llama.cpp's server's
    # prefill); else only when `continue_final_message` says so (vLLM's).
    prefills: ClassVar[bool] = False
    # Its embeddings place paraphrases close (`meaning`) rather than texts sharing words.
    paraphrases: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._modes: list[Mode] = [ok()]
        self._rng: random.Random | None = None
        self._cancelled = 0
        self._cancel_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._inflight: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self._released: asyncio.Event | None = None

    # -- control, from the test's thread ------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The OpenAI-style base URL, ending in /v1."""
        if self.tls is not None:
            return f"https://localhost:{self.port}/v1"
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def last_json(self) -> Any:
        """The parsed body of the last request, or None."""
        return self.requests[-1].json if self.requests else None

    @property
    def connections(self) -> int:
        """How many client connections the recorded requests came on."""
        return len({r.peer for r in self.requests})

    @property
    def cancelled(self) -> int:
        """How many requests the client left before the fake finished answering."""
        return self._cancelled

    def set_mode(self, *modes: Mode) -> None:
        """Queue modes for the next POSTs; the last one repeats."""
        with self._lock:
            self._modes = list(modes) or [ok()]
            self._rng = None

    def reset(self) -> None:
        """Forget requests and cancels; answer ok() again."""
        with self._lock:
            self._modes = [ok()]
            self._rng = None
            self.requests.clear()
            self._cancelled = 0
            self._cancel_event.clear()

    def release(self) -> None:
        """Let every request `held()` now, or later, go on."""
        loop, released = self._loop, self._released
        assert loop is not None and released is not None, "the fake is not running"
        loop.call_soon_threadsafe(released.set)

    def wait_for_cancel(self, timeout: float = 5.0) -> bool:
        """Block until a client has left mid-answer; False on timeout."""
        return self._cancel_event.wait(timeout)

    def start(self) -> FakeUpstream:
        """Bind 127.0.0.1 and serve from a daemon thread with its own event loop."""
        if self._thread is not None:
            return self
        sock = socket.create_server(("127.0.0.1", self.port))
        self.port = int(sock.getsockname()[1])
        self._stopping = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sock, ready), daemon=True,
                                        name=f"fake-{self.name}")
        self._thread.start()
        if not ready.wait(10) or not self._thread.is_alive():
            raise RuntimeError(f"fake upstream {self.name} did not start")
        return self

    def stop(self) -> None:
        """Cancel what is in flight, close the server and join its thread."""
        thread, loop, stop_requested = self._thread, self._loop, self._stop_requested
        if thread is None:
            return
        if loop is not None and stop_requested is not None and thread.is_alive():
            loop.call_soon_threadsafe(stop_requested.set)
        thread.join(10)
        self._thread = self._loop = self._stop_requested = None
        if thread.is_alive():
            raise RuntimeError(f"fake upstream {self.name} did not stop")

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the server, in its own thread ----------------------------------------------------------

    def _run(self, sock: socket.socket, ready: threading.Event) -> None:
        try:
            asyncio.run(self._serve(sock, ready))
        finally:
            ready.set()  # start() must not wait out its timeout on a server that failed

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._released = asyncio.Event()
        # Cancel handlers when the client leaves, so the fake can count abandoned requests.
        runner = web.AppRunner(self._app(), handle_signals=False, access_log=None,
                               handler_cancellation=True, shutdown_timeout=2.0)
        await runner.setup()
        try:
            await web.SockSite(runner, sock, ssl_context=self.tls).start()
            ready.set()
            await self._stop_requested.wait()
            self._stopping = True
            for task in list(self._inflight):
                task.cancel()
        finally:
            await runner.cleanup()
            sock.close()

    def _routes(self, app: web.Application) -> None:
        """The endpoints served; a fake of another API (see fake_anthropic.py) overrides it."""
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._list_models)
        for endpoint in NATIVE:
            app.router.add_post(f"/v1/{endpoint}", self._native)
        for path in ("/v1/fine_tuning/jobs", "/v1/vector_stores/{store}"):
            app.router.add_route("*", path, self._resource)

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self._routes(app)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    def _next_mode(self) -> Mode:
        with self._lock:
            mode = self._modes.pop(0) if len(self._modes) > 1 else self._modes[0]
            if mode.kind == "chaos":
                if self._rng is None:
                    self._rng = random.Random(mode.seed)
                mode = self._rng.choice(mode.options)
            return mode

    def _count_cancel(self) -> None:
        if self._stopping:  # stop() cancelled it, not the client
            return
        with self._lock:
            self._cancelled += 1
        self._cancel_event.set()

    async def _record(self, request: web.Request) -> Any:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except (ValueError, RecursionError):
            parsed = None
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.requests.append(Recorded(request.method, request.path,
                                      {k.lower(): v for k, v in request.headers.items()},
                                      body, parsed, tuple(peer) if peer else None))
        return parsed

    async def _list_models(self, request: web.Request) -> web.Response:
        await self._record(request)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": self.name}
                for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _unknown(self, request: web.Request) -> web.Response:
        await self._record(request)
        return _error(404, f"fake {self.name} has no {request.method} {request.path}")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _ChatShape())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _CompletionShape())

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _ResponsesShape())

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _EmbeddingShape(meaning if self.paraphrases
                                                           else vector))

    async def _native(self, request: web.Request) -> web.StreamResponse:
        """Moderations, rerank, images and audio (`tests.fake_native`), with the same modes."""
        endpoint = request.path.removeprefix("/v1/")
        parsed = await self._record(request)
        raw = self.requests[-1].body
        mode = self._next_mode()
        if mode.kind in ("slow", "held"):
            await (asyncio.sleep(mode.seconds) if mode.kind == "slow" else self._until_released())
            mode = mode.then or ok()
        if mode.kind == "hang":
            await _forever()
        if mode.kind == "status":
            return _error(mode.code, mode.message, mode.retry_after, mode.body)
        if mode.kind == "echo":
            return _error(mode.code, f"debug: {echoed(request)}")
        if mode.kind == "invalid_json":
            return web.Response(body=NOT_JSON, content_type="application/json")
        try:
            return await self._native_answer(request, endpoint, parsed, raw, mode)
        except fake_native.Refused as refused:
            envelope = {"error": {"message": str(refused), "type": "invalid_request_error",
                                  "param": refused.param, "code": None}}
            return web.json_response(envelope, status=400)

    async def _resource(self, request: web.Request) -> web.Response:
        """An API the gateway does not model (reached through `/passthrough`): what came, and
        for a store named `echo` the request's headers, as a debugging upstream quotes them."""
        await self._record(request)
        mode = self._next_mode()
        if mode.kind == "status":
            return _error(mode.code, mode.message, mode.retry_after, mode.body)
        answer: dict[str, Any] = {"object": "list", "method": request.method,
                                  "path": request.path, "query": request.query_string,
                                  "received": len(self.requests[-1].body), "data": []}
        if request.match_info.get("store") == "echo":
            answer["debug"] = echoed(request)
        return web.json_response(answer, headers={"X-Echo": echoed(request)}
                                 if request.match_info.get("store") == "echo" else None)

    async def _native_answer(self, request: web.Request, endpoint: str, parsed: Any, raw: bytes,
                             mode: Mode) -> web.StreamResponse:
        if endpoint in FORMS:
            fields, files = fake_native.form_of(raw, request.headers.get("Content-Type", ""))
            if endpoint == "images/edits":
                sources = files.get("image") or files.get("image[]")
                if not sources:
                    raise fake_native.Refused("'image' is a required property", "image")
                return web.json_response(fake_native.images(fields, sources[0]))
            return fake_native.transcript(fields, files, endpoint == "audio/translations")
        if not isinstance(parsed, dict):
            raise fake_native.Refused("request body is not a JSON object")
        if endpoint == "audio/speech":
            pause = self._until_released if mode.kind == "held_mid" else None
            return await fake_native.speech(request, parsed, pause)
        answers = {"moderations": fake_native.moderation, "rerank": fake_native.rerank,
                   "images/generations": fake_native.images}
        return web.json_response(answers[endpoint](parsed))

    async def _answer(self, request: web.Request, shape: _Shape) -> web.StreamResponse:
        body = await self._record(request)
        if not isinstance(body, dict):
            return _error(400, "request body is not a JSON object")
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        try:
            response = await self._play(request, self._next_mode(), body, shape)
            if not response.prepared:  # as OpenAI's edge does: a cookie on every answer
                response.set_cookie("__cf_bm", f"edge-{len(self.requests)}")
            return response
        except asyncio.CancelledError:
            self._count_cancel()
            raise
        except ConnectionResetError:
            self._count_cancel()
            # The client is gone; aiohttp fails quietly writing this, rather than logging.
            return web.Response(status=499)
        finally:
            self._inflight.discard(task)

    async def _until_released(self) -> None:
        assert self._released is not None
        await self._released.wait()

    def _pieces(self, mode: Mode, body: dict[str, Any]) -> list[str]:
        """The text of the answer `mode` gives, as the deltas a stream writes it in."""
        if mode.kind == "echo_prompt":
            said = prompt_text(body)
            return [said[:mode.after_chunks], said[mode.after_chunks:]]
        content = f"Hello from {self.name}" if mode.content is None else mode.content
        return list(mode.chunks) if mode.chunks else _words(content)

    async def _play(self, request: web.Request, mode: Mode, body: dict[str, Any],
                    shape: _Shape) -> web.StreamResponse:
        streaming = bool(body.get("stream"))
        if mode.kind == "cut" and mode.then is not None and not streaming:
            mode = mode.then
        if isinstance(shape, _EmbeddingShape) and (problem := embedding_problem(body)):
            return _error(400, problem)
        if mode.kind in ("slow", "held"):
            await (asyncio.sleep(mode.seconds) if mode.kind == "slow" else self._until_released())
            return await self._play(request, mode.then or ok(), body, shape)
        if mode.kind == "hang":
            await _forever()
        if mode.kind == "status":
            return _error(mode.code, mode.message, mode.retry_after, mode.body)
        if mode.kind == "echo":
            return await _echo(request, mode, shape, body)
        if mode.kind == "invalid_json" or (mode.kind == "sse_garbage" and not streaming):
            return web.Response(body=NOT_JSON, content_type="application/json")
        if mode.kind == "sse_garbage":
            return await _garbage_stream(request)
        pieces = self._pieces(mode, body)
        if isinstance(shape, _ChatShape):
            pieces = continued(body, pieces, self.prefills)
        if streaming:
            events = [_sse(event) for event in shape.events(body, pieces, mode)]
            pause = self._until_released if mode.kind == "paused" else None
            return await _stream(request, events + ([DONE] if shape.ends_with_done else []), mode,
                                 pause)
        if mode.kind == "cut":
            return await _cut_json(request)
        return web.json_response(shape.whole(body, pieces, mode))


# -- writing answers -------------------------------------------------------------------------


async def _echo(request: web.Request, mode: Mode, shape: _Shape,
                body: dict[str, Any]) -> web.StreamResponse:
    error = {"error": {"message": f"debug: {echoed(request)}", "type": "server_error"}}
    if mode.message == "whole" or not body.get("stream"):
        return _error(mode.code, error["error"]["message"])
    first = [_sse(shape.events(body, ["Hi"], ok())[0])] if mode.message == "mid" else []
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in [*first, _sse(error)]:
        await response.write(event)
        await asyncio.sleep(0.05)
    await response.write_eof()
    return response


async def _forever() -> NoReturn:
    """Wait until cancelled: by the client leaving, or by stop()."""
    await asyncio.get_running_loop().create_future()
    raise AssertionError("unreachable")


def _abort(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


def _error(code: int, message: str | None = None, retry_after: float | str | None = None,
           body: bytes | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if body is None:
        envelope = {"error": {"message": message or f"fake {code}",
                              "type": ERROR_TYPES.get(code, "server_error"), "code": None,
                              "param": None}}
        body = json.dumps(envelope).encode()
    return web.Response(status=code, body=body, headers=headers, content_type="application/json")


def _sse(event: dict[str, Any]) -> bytes:
    # Responses API streams name each event; chat and completions streams do not.
    named = f"event: {event['type']}\n".encode() if "type" in event else b""
    return named + b"data: " + json.dumps(event).encode() + b"\n\n"


async def _stream(request: web.Request, events: list[bytes], mode: Mode,
                  pause: Callable[[], Awaitable[None]] | None = None) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    if mode.kind == "cut":
        events = events[:1 + mode.after_chunks]
    for number, event in enumerate(events):
        if number and mode.delay_between_chunks:
            await asyncio.sleep(mode.delay_between_chunks)
        if pause is not None and number == mode.after_chunks:
            await pause()
        await response.write(event)
    if mode.kind == "cut":
        _abort(request)  # the chunked body never gets its terminating chunk
        return response
    if mode.end_delay:
        await asyncio.sleep(mode.end_delay)
    await response.write_eof()
    return response


async def _garbage_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"<html>oops</html>\n\n")
    await response.write_eof()
    return response


async def _cut_json(request: web.Request) -> web.StreamResponse:
    partial = b'{"id": "chatcmpl-cut", "choices": ['
    response = web.StreamResponse(headers={"Content-Type": "application/json",
                                           "Content-Length": str(len(partial) + 1000)})
    await response.prepare(request)
    await response.write(partial)
    _abort(request)
    return response


# -- what answers contain --------------------------------------------------------------------


def _words(text: str) -> list[str]:
    """Split on spaces keeping them: "Hello from x" -> ["Hello", " from", " x"]."""
    pieces = text.split(" ")
    return [pieces[0]] + [f" {p}" for p in pieces[1:]]


# A model asked in words to go on from a cut-off answer starts a few words back.
REPEATED_WORDS = 3


def continued(body: dict[str, Any], pieces: list[str], prefills: bool = False) -> list[str]:
    """What a model whose answer is `pieces` says when asked to go on with a partial answer of
    it: after a final assistant message it is told to continue (vLLM's
    `continue_final_message`), or any final assistant message when it `prefills`, the rest;
    asked in words after one ("cut off ... continue"), the rest from a few words back, as
    models repeat themselves at such a seam. Anything else is a new answer."""
    messages = body.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return pieces
    last, before = messages[-1], messages[-2]
    if last.get("role") == "assistant" and (prefills or body.get("continue_final_message")):
        partial, repeat = last.get("content"), 0
    elif last.get("role") == "user" and before.get("role") == "assistant" \
            and "cut off" in str(last.get("content")):
        partial, repeat = before.get("content"), REPEATED_WORDS
    else:
        return pieces
    return after_prefix(pieces, partial, repeat)


def after_prefix(pieces: list[str], partial: Any, repeat: int = 0) -> list[str]:
    """`pieces` after those that make `partial` (a prefix of their text), `repeat` of them
    again; all of them when `partial` is not such a prefix."""
    if not isinstance(partial, str) or not "".join(pieces).startswith(partial.rstrip()):
        return pieces
    at = count = 0
    for piece in pieces:
        if at + len(piece.rstrip()) > len(partial.rstrip()) or at >= len(partial):
            break
        at += len(piece)
        count += 1
    return pieces[max(0, count - repeat):]


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A rough count: words of the JSON-encoded messages (or prompt, or input)."""
    # Encoded, not just the text: the suite's expected totals (e.g. 7 for "Hello") rely on it.
    text = json.dumps(body.get("messages") or body.get("prompt") or body.get("input") or "")
    return max(1, len(text.split()))


def _usage(body: dict[str, Any], completion_tokens: int) -> dict[str, int]:
    prompt_tokens = _prompt_tokens(body)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _n(body: dict[str, Any]) -> int:
    n = body.get("n")
    return min(n, MAX_CHOICES) if isinstance(n, int) and n > 0 else 1


def _prompts(body: dict[str, Any]) -> list[str]:
    """One entry per prompt of a legacy completion (token-id prompts count, with no text)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return prompt[:MAX_CHOICES]
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return [""] * min(len(prompt), MAX_CHOICES)
    return [""]


def _logprobs(pieces: list[str]) -> dict[str, Any]:
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {"tokens": pieces, "token_logprobs": [-0.1] * len(pieces),
            "top_logprobs": [{piece: -0.1} for piece in pieces], "text_offset": offsets}


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


class _Shape:
    """How one endpoint's answers look; subclasses per endpoint."""

    ends_with_done = True

    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        raise NotImplementedError

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        raise NotImplementedError


class _ChatShape(_Shape):
    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(pieces) or None,
                                   "refusal": None}
        if mode.reasoning:
            message["reasoning_content"] = mode.reasoning
        if mode.tool:
            message["tool_calls"] = [{"id": "call_1", "type": "function",
                                      "function": {"name": mode.tool[0],
                                                   "arguments": mode.tool[1]}}]
        logprobs = {"content": [_token_logprob(p) for p in pieces if p], "refusal": None} \
            if body.get("logprobs") else None
        choices = [{"index": i, "message": message, "logprobs": logprobs,
                    "finish_reason": mode.finish_reason} for i in range(_n(body))]
        answer = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                  "model": body.get("model"), "choices": choices,
                  "system_fingerprint": FINGERPRINT}
        if mode.usage:
            answer["usage"] = _usage(body, len(pieces))
        return answer

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], finish: str | None, index: int) -> dict[str, Any]:
            logprobs = {"content": [_token_logprob(delta["content"])]} \
                if body.get("logprobs") and delta.get("content") else None
            return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                    "model": body.get("model"), "system_fingerprint": FINGERPRINT,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                 "finish_reason": finish}]}

        deltas: list[tuple[dict[str, Any], str | None]] = [
            ({"role": "assistant", "content": ""}, None)]
        if mode.reasoning:
            deltas.append(({"reasoning_content": mode.reasoning}, None))
        deltas += [({"content": piece}, None) for piece in pieces if piece]
        deltas += [(delta, None) for delta in _tool_deltas(mode.tool)]
        deltas.append(({}, mode.finish_reason))
        events = [chunk(delta, finish, index)
                  for delta, finish in deltas for index in range(_n(body))]
        if _include_usage(body) and mode.usage:
            events.append({**chunk({}, None, 0), "choices": [],
                           "usage": _usage(body, len(pieces))})
        return events


FINGERPRINT = "fp_fake"


def _token_logprob(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.25, "bytes": list(token.encode()),
            "top_logprobs": [{"token": token, "logprob": -0.25, "bytes": list(token.encode())}]}


def _tool_deltas(tool: tuple[str, str] | None) -> list[dict[str, Any]]:
    """A tool call streamed as vLLM does: name first, then the arguments in thirds."""
    if tool is None:
        return []
    name, arguments = tool
    third = max(1, len(arguments) // 3)
    deltas = [{"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": name, "arguments": ""}}]}]
    deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": arguments[i:i + third]}}]}
               for i in range(0, len(arguments), third)]
    return deltas


class _CompletionShape(_Shape):
    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for prompt in _prompts(body):
            shown = [p for p in _words(prompt) if p] + pieces if body.get("echo") else pieces
            logprobs = _logprobs(shown) if body.get("logprobs") is not None else None
            choices += [{"text": "".join(shown), "index": len(choices) + i, "logprobs": logprobs,
                         "finish_reason": mode.finish_reason} for i in range(_n(body))]
        answer = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
                  "model": body.get("model"), "choices": choices}
        if mode.usage:
            answer["usage"] = _usage(body, len(pieces))
        return answer

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        """Token by token, echo first, each with its own logprobs: what they assemble into is
        exactly `whole`."""
        def chunk(text: str, finish: str | None, index: int,
                  logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
            return {"id": "cmpl-fake", "object": "text_completion", "created": 1,
                    "model": body.get("model"),
                    "choices": [{"text": text, "index": index, "logprobs": logprobs,
                                 "finish_reason": finish}]}

        shown_per_choice = [
            ([p for p in _words(prompt) if p] if body.get("echo") else []) + pieces
            for prompt in _prompts(body) for _ in range(_n(body))]
        events = [chunk("", None, index) for index in range(len(shown_per_choice))]
        for index, shown in enumerate(shown_per_choice):
            whole = _logprobs(shown)
            for at, token in enumerate(shown):
                logprobs = {name: values[at:at + 1] for name, values in whole.items()} \
                    if body.get("logprobs") is not None else None
                events.append(chunk(token, None, index, logprobs))
        events += [chunk("", mode.finish_reason, index)
                   for index in range(len(shown_per_choice))]
        if _include_usage(body) and mode.usage:
            events.append({**chunk("", None, 0), "choices": [],
                           "usage": _usage(body, len(pieces))})
        return events


DIMENSIONS = 8  # of the fake's embeddings, unless the request asks for `dimensions`
MAX_DIMENSIONS = 4096  # more is refused with a 400, as real embedding models refuse it


def vector(text: str | list[int], dimensions: int = DIMENSIONS) -> list[float]:
    """The fake's embedding of one input: its words hashed into buckets, normalised, so
    texts sharing words are close and the same text always gets the same vector."""
    words = text.lower().split() if isinstance(text, str) else [str(t) for t in text]
    buckets = [0.0] * dimensions
    for word in words:
        buckets[zlib.crc32(word.strip(".,!?").encode()) % dimensions] += 1.0
    norm = math.sqrt(sum(b * b for b in buckets)) or 1.0
    return [b / norm for b in buckets]


MEANING_DIMENSIONS = 256
# Words that say little of what a question asks: dropped before `meaning` hashes the rest.
STOPWORDS = frozenset({"a", "an", "the", "is", "are", "was", "were", "be", "what", "whats",
                       "which", "who", "how", "of", "in", "on", "at", "to", "for", "and", "or",
                       "s", "do", "does", "me", "tell", "please", "i", "you"})


def meaning(text: str | list[int], dimensions: int = MEANING_DIMENSIONS) -> list[float]:
    """A fake embedding under which paraphrases are close: words lowercased, punctuation and
    stopwords dropped ("What is the capital of France?" and "what's France's capital city"
    share `capital` and `france`), hashed into buckets, normalised."""
    words = [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS] \
        if isinstance(text, str) else [str(t) for t in text]
    buckets = [0.0] * dimensions
    for word in words:
        buckets[zlib.crc32(word.encode()) % dimensions] += 1.0
    norm = math.sqrt(sum(b * b for b in buckets)) or 1.0
    return [b / norm for b in buckets]


def embedding_problem(body: dict[str, Any], field: str = "dimensions") -> str | None:
    """What a real embeddings API would refuse in this body, if anything."""
    size = body.get(field)
    if size is not None and not (isinstance(size, int) and 0 < size <= MAX_DIMENSIONS):
        return f"{field} must be between 1 and {MAX_DIMENSIONS}"
    return None


def embedding_inputs(body: dict[str, Any]) -> list[Any]:
    given = body.get("input")
    if isinstance(given, str) or (isinstance(given, list) and given
                                  and all(isinstance(x, int) for x in given)):
        return [given]
    return given if isinstance(given, list) else []


class _EmbeddingShape(_Shape):
    def __init__(self, embed: Callable[[str | list[int], int], list[float]] = vector) -> None:
        self.embed = embed

    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        inputs = embedding_inputs(body)
        dimensions = body.get("dimensions") or \
            (MEANING_DIMENSIONS if self.embed is meaning else DIMENSIONS)
        data = []
        for index, text in enumerate(inputs):
            values = self.embed(text, dimensions)
            encoded: Any = values
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(t.split()) if isinstance(t, str) else len(t) for t in inputs)
        return {"object": "list", "model": body.get("model"), "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        raise AssertionError("embeddings do not stream")


class _ResponsesShape(_Shape):
    ends_with_done = False  # a Responses stream ends with response.completed, not [DONE]

    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        input_tokens = _prompt_tokens(body)
        return {"id": "resp_fake", "object": "response", "created_at": int(time.time()),
                "status": "completed", "model": body.get("model"), "tools": [],
                "tool_choice": "auto", "parallel_tool_calls": True,
                "output": [{"type": "message", "id": "msg_fake", "status": "completed",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": "".join(pieces),
                                         "annotations": []}]}],
                "usage": {"input_tokens": input_tokens, "output_tokens": len(pieces),
                          "total_tokens": input_tokens + len(pieces)}}

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        final = self.whole(body, pieces, mode)
        opening = {**final, "status": "in_progress", "output": [], "usage": None}
        item = {**final["output"][0], "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": opening},
            {"type": "response.output_item.added", "output_index": 0, "item": item},
            {"type": "response.content_part.added", **where, "part": part}]
        events += [{"type": "response.output_text.delta", **where, "delta": piece, "logprobs": []}
                   for piece in pieces]
        events += [{"type": "response.output_text.done", **where, "text": "".join(pieces),
                    "logprobs": []},
                   {"type": "response.output_item.done", "output_index": 0,
                    "item": final["output"][0]},
                   {"type": "response.completed", "response": final}]
        for number, event in enumerate(events):
            event["sequence_number"] = number
        return events
