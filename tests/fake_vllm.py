"""A stand-in for `vllm serve MODEL [options]`: the real CLI and HTTP surface, no GPU, no model.

Run as `python tests/fake_vllm.py serve MODEL ...` (tests put a `vllm` wrapper on PATH, see
fake_gpu.py). It parses vLLM's options, insists on enough CUDA_VISIBLE_DEVICES, serves the OpenAI
endpoints with answers naming the worker, exports vLLM's Prometheus gauges, batches at most
--max-num-seqs requests at once and drains in-flight requests on SIGTERM. Environment knobs:

FAKE_VLLM_LOAD_SECONDS     sleep this long "loading weights" before listening (default 0)
FAKE_VLLM_EXIT_AT_START    exit with this code right after parsing the command line
FAKE_VLLM_RECORD           append one JSON line per event (start, ready, sigterm, exit, fail)
FAKE_VLLM_TOKEN_DELAY      seconds between streamed chunks (default 0.01)
FAKE_VLLM_IGNORE_SIGTERM   if set, log SIGTERM and carry on (only SIGKILL or SIGINT stop it)
FAKE_VLLM_ANSWER           the text of every answer (default: a sentence naming the worker)

A chat answer honours `continue_final_message` as vLLM does: the final, assistant, message is
left open and the answer goes on from it (no new turn); with `add_generation_prompt` also true
the request is refused. POST /fake/fault {"cut_after": N} cuts the next streamed answer after
its first N chunks (the connection dropped, as when the engine dies mid-answer).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

# Run as a script, only tests/ is on sys.path; the answer shapes live in tests/upstream.py.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.upstream import (
    DONE,
    _ChatShape,
    _CompletionShape,
    _Shape,
    _sse,
    _stream,
    _words,
    continued,
    ok,
)

VERSION = "0.11.0+fake"
DEFAULT_MAX_MODEL_LEN = 32768  # what a real server would read from the model's config
LATENCY_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0)
GAUGES = {  # vLLM's gauge name -> (its /fake/metrics override key, help text)
    "vllm:num_requests_running": ("running", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("waiting", "Number of requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("kv_cache", "KV-cache usage. 1 means 100 percent usage."),
    # The pre-v1 name of the same figure, still read by older dashboards and scrapers.
    "vllm:gpu_cache_usage_perc": ("kv_cache", "GPU KV-cache usage. 1 means 100 percent usage."),
}
OVERRIDES = frozenset(key for key, _ in GAUGES.values())


# -- logging and the event record ------------------------------------------------------------


def log(level: str, message: str) -> None:
    """One vLLM-style log line on stderr, flushed so a supervisor sees it at once."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    sys.stderr.write(f"{level} {stamp} [fake_vllm.py] {message}\n")
    sys.stderr.flush()


def record(event: str, **fields: Any) -> None:
    """Append one JSON line to $FAKE_VLLM_RECORD, if set."""
    path = os.environ.get("FAKE_VLLM_RECORD")
    if not path:
        return
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
    # O_APPEND and a single write(): lines from several fakes sharing the file never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- the command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """`vllm [--version] serve MODEL [options]`; anything unknown is an error (exit 2)."""
    top = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    top.add_argument("--version", action="version", version=VERSION)
    commands = top.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", allow_abbrev=False)
    serve.add_argument("model", help="a local path or a Hugging Face id")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--api-key")
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    serve.add_argument("--max-model-len", type=int)
    serve.add_argument("--gpu-memory-utilization", type=float)
    serve.add_argument("--max-num-seqs", type=int, default=256)
    serve.add_argument("--max-num-batched-tokens", type=int)
    serve.add_argument("--shutdown-timeout", type=float, default=0.0)
    serve.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    serve.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction)
    serve.add_argument("--reasoning-parser")
    serve.add_argument("--tool-call-parser")
    serve.add_argument("--enable-auto-tool-choice", action="store_true")
    serve.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float",
                                           "float32"])
    serve.add_argument("--trust-remote-code", action="store_true")
    # vLLM 0.10+: "pooling" serves /v1/embeddings (and refuses generation), as `--task embed` did.
    serve.add_argument("--runner", choices=["auto", "generate", "pooling"], default="auto")
    # "priority": requests carry `priority` (lower first); under fcfs a nonzero one is refused.
    serve.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    # Other options a pool's `args` commonly pass on; accepted and ignored.
    for flag in ("--quantization", "--kv-cache-dtype", "--chat-template", "--tokenizer",
                 "--revision", "--download-dir", "--seed", "--uvicorn-log-level",
                 "--generation-config"):
        serve.add_argument(flag)
    for flag in ("--enforce-eager", "--disable-log-requests", "--disable-log-stats",
                 "--disable-uvicorn-access-log"):
        serve.add_argument(flag, action="store_true")
    return top


def with_dashes(argv: list[str]) -> list[str]:
    """`--max_model_len=8` -> `--max-model-len=8`, as vLLM's FlexibleArgumentParser accepts."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            arg = key.replace("_", "-") + eq + value
        out.append(arg)
    return out


def visible_devices() -> list[str]:
    """The entries of CUDA_VISIBLE_DEVICES (indexes or GPU-UUIDs); empty when unset."""
    return [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def startup_failure(args: argparse.Namespace) -> int | None:
    """The exit code if this worker must fail before loading (as asked, or for lack of GPUs)."""
    requested = os.environ.get("FAKE_VLLM_EXIT_AT_START")
    if requested:
        log("ERROR", f"EngineCore failed to start (FAKE_VLLM_EXIT_AT_START={requested})")
        record("fail", port=args.port, code=int(requested), reason="FAKE_VLLM_EXIT_AT_START")
        return int(requested)
    devices = visible_devices()
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if not devices:
        problem = "RuntimeError: No CUDA GPUs are available (CUDA_VISIBLE_DEVICES is empty)"
    elif len(devices) < world:
        problem = (f"RuntimeError: World size (tensor_parallel_size ({args.tensor_parallel_size})"
                   f" x pipeline_parallel_size ({args.pipeline_parallel_size})) is larger than"
                   f" the number of available GPUs ({len(devices)}) in this node.")
    else:
        return None
    log("ERROR", "EngineCore failed to start.")
    sys.stderr.write(problem + "\n")
    sys.stderr.flush()
    record("fail", port=args.port, code=1, reason=problem)
    return 1


def bind(host: str, port: int) -> socket.socket:
    """Reserve the port now and listen only once loaded, as vLLM does (refused until then)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


# -- HTTP answers ----------------------------------------------------------------------------


def new_error(code: int, message: str, kind: str) -> web.Response:
    """vLLM's current error envelope: {"error": {message, type, param, code}}."""
    envelope = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(envelope, status=code)


def old_error(code: int, message: str, kind: str) -> web.Response:
    """vLLM's older, flat error body: {"object": "error", message, type, param, code}."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": code}
    return web.json_response(body, status=code)


def label(value: str) -> str:
    """A Prometheus label value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Worker:
    """One fake engine: its HTTP app, batching slots, counters and shutdown."""

    def __init__(self, args: argparse.Namespace, sock: socket.socket) -> None:
        self.args = args
        self.sock = sock
        self.port = int(sock.getsockname()[1])
        self.served = list(args.served_model_name or [args.model])
        self.devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY")
        self.token_delay = float(os.environ.get("FAKE_VLLM_TOKEN_DELAY") or 0.01)
        self.slots = asyncio.Semaphore(max(1, args.max_num_seqs))
        self.running = self.waiting = self.completed = 0
        self.latencies: list[float] = []
        self.overrides: dict[str, float] = {}
        self.cuts: list[int] = []  # armed faults: the next streamed answers cut after N chunks
        self.last_request: Any = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self.idle = asyncio.Event()  # set whenever nothing is in flight
        self.idle.set()
        self.draining = False

    @property
    def inflight(self) -> int:
        """Requests accepted and not yet answered: waiting for a slot or running."""
        return len(self.tasks)

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        """Load, serve until SIGTERM/SIGINT, drain, exit 0."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.on_signal, signum)
        if not await self.load():
            log("INFO", "Shutting down before the model was loaded")
            record("exit", port=self.port)
            return 0
        runner = web.AppRunner(self.app(), handle_signals=False, access_log=None,
                               handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.SockSite(runner, self.sock).start()
        except OSError as exc:  # another worker listened on the port while this one loaded
            log("ERROR", f"Could not listen on {self.args.host}:{self.port}: {exc}")
            record("fail", port=self.port, code=1, reason=str(exc))
            await runner.cleanup()
            return 1
        log("INFO", f"Starting vLLM API server 0 on http://{self.args.host}:{self.port}")
        log("INFO", "Application startup complete.")
        record("ready", port=self.port)
        await self.stopping.wait()
        await self.drain()
        await runner.cleanup()
        log("INFO", "Application shutdown complete.")
        record("exit", port=self.port)
        return 0

    async def load(self) -> bool:
        """Pretend to load weights for FAKE_VLLM_LOAD_SECONDS; False if stopped meanwhile."""
        seconds = float(os.environ.get("FAKE_VLLM_LOAD_SECONDS") or 0)
        log("INFO", f"Starting to load model {self.args.model}...")
        shards = 4
        for shard in range(shards):
            log("INFO", f"Loading model weights... safetensors shard {shard + 1}/{shards}")
            if seconds > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), seconds / shards)
            if self.stopping.is_set():
                return False
        log("INFO", f"Loading weights took {seconds:.2f} seconds")
        return True

    def on_signal(self, signum: int) -> None:
        """First SIGTERM/SIGINT starts the drain; a second one cuts it short."""
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM and os.environ.get("FAKE_VLLM_IGNORE_SIGTERM"):
            log("WARNING", "Received SIGTERM, ignoring it (FAKE_VLLM_IGNORE_SIGTERM)")
            record("sigterm", port=self.port, inflight=self.inflight, ignored=True)
            return
        if self.stopping.is_set():
            self.forced.set()
            return
        log("INFO", f"Received {name}, Shutting down ({self.inflight} requests in flight)")
        record(name.lower(), port=self.port, inflight=self.inflight)
        self.stopping.set()

    async def drain(self) -> None:
        """Answer 503 to new requests; let in-flight ones finish until --shutdown-timeout."""
        self.draining = True
        if self.inflight and self.args.shutdown_timeout > 0:
            log("INFO", f"Waiting up to {self.args.shutdown_timeout}s for {self.inflight}"
                        " in-flight requests")
            waits = {asyncio.create_task(self.idle.wait()), asyncio.create_task(self.forced.wait())}
            await asyncio.wait(waits, timeout=self.args.shutdown_timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
        if self.inflight:
            log("WARNING", f"Aborting {self.inflight} requests still in flight")
        for task in list(self.tasks):
            task.cancel()  # the client sees its connection closed, as vLLM aborts them

    # -- routes ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The routes a vLLM OpenAI server has, plus /fake/* controls."""
        app = web.Application(middlewares=[self.gate], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):  # as vLLM serves it
            app.router.add_post(path, self.rerank)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/fake/metrics", self.set_metrics)
        app.router.add_post("/fake/fault", self.set_fault)
        app.router.add_get("/fake/stats", self.stats)
        app.router.add_get("/fake/last_request", self.last)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app

    @web.middleware
    async def gate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """503 while draining (except /fake/*); the API key on /v1/* when one is set."""
        if self.draining and not request.path.startswith("/fake/"):
            return new_error(503, "The server is shutting down.", "ServiceUnavailableError")
        authorized = request.headers.get("Authorization") == f"Bearer {self.api_key}"
        if self.api_key and request.path.startswith("/v1/") and not authorized:
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def not_found(self, request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    async def models(self, request: web.Request) -> web.Response:
        max_len = self.args.max_model_len or DEFAULT_MAX_MODEL_LEN
        data = [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                 "root": self.args.model, "parent": None, "max_model_len": max_len,
                 "permission": []} for name in self.served]
        return web.json_response({"object": "list", "data": data})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"served": self.completed, "inflight": self.inflight,
                                  "running": self.running, "waiting": self.waiting,
                                  "pid": os.getpid(), "port": self.port})

    async def last(self, request: web.Request) -> web.Response:
        return web.json_response(self.last_request)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if self.args.runner == "pooling":
            return new_error(400, "The model does not support Chat Completions API",
                             "BadRequestError")
        return await self.complete(request, _ChatShape(), "messages")

    async def embeddings(self, request: web.Request) -> web.Response:
        """A pooling runner's embeddings: a deterministic vector per input (by its words)."""
        if self.args.runner != "pooling":
            return new_error(400, "The model does not support Embeddings API", "BadRequestError")
        body = await request.json()
        given = body.get("input")
        texts = [given] if isinstance(given, str) else list(given or [])
        data = []
        for index, text in enumerate(texts):
            buckets = [0.0] * 16
            for word in str(text).lower().split():
                buckets[sum(word.encode()) % 16] += 1.0
            data.append({"object": "embedding", "index": index, "embedding": buckets})
        tokens = sum(len(str(t).split()) for t in texts)
        return web.json_response({"object": "list", "model": body.get("model"), "data": data,
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def rerank(self, request: web.Request) -> web.Response:
        """A pooling runner's rerank (the Cohere/Jina shape): documents by the share of the
        query's words they have, best first, `top_n` of them."""
        if self.args.runner != "pooling":
            return new_error(400, "The model does not support Rerank (Score) API",
                             "BadRequestError")
        body = await request.json()
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list) or not documents:
            return new_error(400, "query and documents are required", "BadRequestError")
        texts = [d.get("text", "") if isinstance(d, dict) else str(d) for d in documents]
        words = set(query.lower().split())
        scores = [len(words & set(t.lower().split())) / max(1, len(words)) for t in texts]
        ranked = sorted(range(len(texts)), key=lambda i: -scores[i])[:body.get("top_n")
                                                                     or len(texts)]
        tokens = sum(len(t.split()) for t in [query, *texts])
        return web.json_response({
            "id": "rerank-fake", "model": body.get("model"), "usage": {"total_tokens": tokens},
            "results": [{"index": i, "document": {"text": texts[i]},
                         "relevance_score": scores[i]} for i in ranked]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.complete(request, _CompletionShape(), "prompt")

    # -- completions ----------------------------------------------------------------------------

    def refusal(self, body: Any, required: str) -> web.Response | None:
        """The error vLLM would answer this body with, or None."""
        if not isinstance(body, dict):
            return new_error(400, "The request body must be a JSON object.", "BadRequestError")
        if body.get("fake_error") == "old":
            return old_error(400, "fake_error: old-style error requested", "BadRequestError")
        if body.get("fake_error") is not None:
            return new_error(400, "fake_error: error requested", "BadRequestError")
        model = body.get("model")
        if model is not None and model not in self.served:
            return new_error(404, f"The model `{model}` does not exist.", "NotFoundError")
        if required not in body:
            return new_error(400, f"Field required: {required}", "BadRequestError")
        if body.get("continue_final_message") and body.get("add_generation_prompt"):
            return new_error(400, "Cannot set both `continue_final_message` and "
                             "`add_generation_prompt` to True.", "BadRequestError")
        if body.get("priority", 0) != 0 and self.args.scheduling_policy != "priority":
            return new_error(400, f"Got priority {body['priority']} but Priority scheduling "
                             "is not enabled.", "BadRequestError")
        return self.too_long(body, required)

    def too_long(self, body: dict[str, Any], required: str) -> web.Response | None:
        """vLLM's answer to a prompt and output its window cannot hold, in its words (the
        fake's tokens are words of the JSON-encoded prompt)."""
        window = self.args.max_model_len or DEFAULT_MAX_MODEL_LEN
        prompt = len(json.dumps(body[required]).split())
        output = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        if not isinstance(output, int) or prompt + output <= window:
            return None
        return new_error(400, f"This model's maximum context length is {window} tokens. "
                         f"However, you requested {prompt + output} tokens ({prompt} in the "
                         f"messages, {output} in the completion). Please reduce the length of "
                         "the messages or completion.", "BadRequestError")

    async def complete(self, request: web.Request, shape: _Shape,
                       required: str) -> web.StreamResponse:
        """Queue for a batch slot, then answer (streamed or whole)."""
        try:
            body = await request.json()
        except ValueError:
            return new_error(400, "The request body is not valid JSON.", "BadRequestError")
        self.last_request = body
        refused = self.refusal(body, required)
        if refused is not None:
            return refused
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.idle.clear()
        started = time.monotonic()
        try:
            self.waiting += 1
            try:
                await self.slots.acquire()
            finally:
                self.waiting -= 1
            self.running += 1
            try:
                response = await self.answer(request, body, shape)
            finally:
                self.running -= 1
                self.slots.release()
        except ConnectionResetError:
            return web.Response(status=499)  # the client left; nothing more to write
        finally:
            self.tasks.discard(task)
            if not self.tasks:
                self.idle.set()
        self.completed += 1
        self.latencies.append(time.monotonic() - started)
        return response

    async def answer(self, request: web.Request, body: dict[str, Any],
                     shape: _Shape) -> web.StreamResponse:
        """The completion text names this worker, so tests see where a request was routed."""
        delay = body.get("fake_delay")
        if isinstance(delay, int | float) and delay > 0:
            await asyncio.sleep(delay)  # holds a batch slot, like a long prefill
        body = {**body, "model": body.get("model") or self.served[0]}
        text = os.environ.get("FAKE_VLLM_ANSWER") or (
            f"fake-vllm port={self.port} devices={self.devices} model={body['model']}"
            " says hello from a fake worker")
        pieces = _words(text)
        if isinstance(shape, _ChatShape):  # a final message continued, when told
            pieces = continued(body, pieces)
        mode = ok(text, delay_between_chunks=self.token_delay)
        if body.get("stream") and self.cuts:
            mode = replace(mode, kind="cut", after_chunks=self.cuts.pop(0))
        if body.get("stream"):
            events = [_sse(event) for event in shape.events(body, pieces, mode)]
            return await _stream(request, [*events, DONE], mode)
        return web.json_response(shape.whole(body, pieces, mode))

    # -- metrics --------------------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        """running, waiting, kv_cache: measured, then any /fake/metrics overrides on top."""
        measured = {"running": float(self.running), "waiting": float(self.waiting),
                    "kv_cache": self.running / max(1, self.args.max_num_seqs)}
        return {**measured, **self.overrides}

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text with vLLM's metric names, labels and some unrelated noise."""
        labels = f'engine="0",model_name="{label(self.served[0])}"'
        gauges = self.gauges()
        lines = ["# HELP python_gc_objects_collected_total Objects collected during gc",
                 "# TYPE python_gc_objects_collected_total counter",
                 'python_gc_objects_collected_total{generation="0"} 1234.0']
        for name, (key, help_text) in GAUGES.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                      f"{name}{{{labels}}} {gauges[key]!r}"]
        lines += [
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} '
            f"{float(self.completed)!r}",
            *self.histogram("vllm:e2e_request_latency_seconds", labels)]
        text = "\n".join(lines) + "\n"
        return web.Response(body=text.encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def histogram(self, name: str, labels: str) -> list[str]:
        """The request latency histogram, in Prometheus' bucket/sum/count form."""
        lines = [f"# HELP {name} Histogram of e2e request latency in seconds.",
                 f"# TYPE {name} histogram"]
        for bound in LATENCY_BUCKETS:
            count = sum(1 for seconds in self.latencies if seconds <= bound)
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)!r}')
        lines += [f'{name}_bucket{{{labels},le="+Inf"}} {float(len(self.latencies))!r}',
                  f"{name}_count{{{labels}}} {float(len(self.latencies))!r}",
                  f"{name}_sum{{{labels}}} {sum(self.latencies)!r}"]
        return lines

    async def set_fault(self, request: web.Request) -> web.Response:
        """Arm a cut of the next streamed answer after `cut_after` chunks."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        cut = body.get("cut_after") if isinstance(body, dict) else None
        if not isinstance(cut, int) or cut < 0:
            return new_error(400, "expected {\"cut_after\": N}", "BadRequestError")
        self.cuts.append(cut)
        return web.json_response({"armed": self.cuts})

    async def set_metrics(self, request: web.Request) -> web.Response:
        """Replace the gauge overrides with this subset of running/waiting/kv_cache; {} clears."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        valid = isinstance(body, dict) and all(
            key in OVERRIDES and isinstance(value, int | float) for key, value in body.items())
        if not valid:
            return new_error(400, f"expected a subset of {sorted(OVERRIDES)} with numbers",
                             "BadRequestError")
        self.overrides = {key: float(value) for key, value in body.items()}
        return web.json_response(self.gauges())


def main(argv: list[str] | None = None) -> int:
    """Parse, check GPUs, reserve the port, then serve; the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(with_dashes(argv))
    served = list(args.served_model_name or [args.model])
    log("INFO", f"vLLM API server version {VERSION}")
    chosen = {key: value for key, value in vars(args).items() if value not in (None, False)}
    log("INFO", f"non-default args: {chosen}")
    record("start", argv=argv, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
           port=args.port, model=args.model, served=served)
    failure = startup_failure(args)
    if failure is not None:
        return failure
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        log("ERROR", f"Could not bind {args.host}:{args.port}: {exc}")
        sys.stderr.write(f"OSError: {exc}\n")
        record("fail", port=args.port, code=1, reason=str(exc))
        return 1
    return asyncio.run(Worker(args, sock).run())


if __name__ == "__main__":
    sys.exit(main())
