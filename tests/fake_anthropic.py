"""A fake Anthropic Messages API: the same modes as `FakeUpstream`, in Anthropic's wire format,
and its Message Batches (`/v1/messages/batches`) as Anthropic answers them."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from tests.upstream import FakeUpstream, Mode, _error, _words, after_prefix, echoed

OVERLOADED = json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                    "message": "Overloaded"}})
# Fields Anthropic refuses ("Extra inputs are not permitted") unless a beta names them.
BETA_FIELDS = {"context_management": "context-management-"}
MAX_BREAKPOINTS = 4  # blocks marked `cache_control` Anthropic takes in one request
TTLS = ("5m", "1h")
BATCH_KEY = "sk-ant-test-key-0123456789"  # the key its batches endpoints take
CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class PromptCache:
    """Prefixes cached at breakpoints, as Anthropic's prompt cache keeps them: a request's
    tokens (one per word of each block's JSON) split into those read from the cache (up to its
    longest breakpoint already cached), those written to it (from there to its last
    breakpoint) and the rest; every breakpoint's prefix is cached after it."""

    def __init__(self) -> None:
        self.prefixes: set[str] = set()

    def clear(self) -> None:
        self.prefixes.clear()

    def usage(self, blocks: list[tuple[Any, str | None]]) -> dict[str, Any]:
        """`blocks`: each block (its `cache_control` left out) and the TTL of the breakpoint
        it ends, if it ends one. Anthropic's usage fields for the prompt."""
        sizes = [len(json.dumps(block).split()) for block, _ in blocks]
        ends = [n + 1 for n, (_, ttl) in enumerate(blocks) if ttl is not None]
        keys = {end: json.dumps([block for block, _ in blocks[:end]]) for end in ends}
        read = max((end for end in ends if keys[end] in self.prefixes), default=0)
        last = max(ends, default=0)
        written = sum(sizes[read:last])
        self.prefixes.update(keys.values())
        ttl = blocks[last - 1][1] if last else "5m"
        return {"input_tokens": sum(sizes[last:]) or 1, "cache_read_input_tokens": sum(
            sizes[:read]), "cache_creation_input_tokens": written, "cache_creation": {
            "ephemeral_5m_input_tokens": written if ttl == "5m" else 0,
            "ephemeral_1h_input_tokens": written if ttl == "1h" else 0}}


def marked_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks a Messages body could mark, in the order Anthropic reads them: tools, system,
    messages."""
    system = body.get("system")
    blocks = [*(body.get("tools") or ()), *(system if isinstance(system, list) else ())]
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        blocks += content if isinstance(content, list) else []
    return [block for block in blocks if isinstance(block, dict)]


def cache_problem(body: dict[str, Any]) -> str | None:
    """What Anthropic would refuse in a body's `cache_control` marks, if anything."""
    marked = [block for block in marked_blocks(body) if "cache_control" in block]
    if len(marked) > MAX_BREAKPOINTS:
        return (f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(marked)}.")
    for block in marked:
        mark = block["cache_control"]
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral" \
                or set(mark) - {"type", "ttl"} or mark.get("ttl", "5m") not in TTLS:
            return "cache_control: Input tag does not match the expected tag 'ephemeral'"
        if block.get("type") == "text" and not block.get("text"):
            return "cache_control cannot be set for empty text blocks"
    return None


def refused(request: web.Request, body: Any) -> web.Response | None:
    """Anthropic's 400 for a body it would refuse whatever the mode, else None."""
    betas = request.headers.get("anthropic-beta", "")
    for name, beta in BETA_FIELDS.items():
        if isinstance(body, dict) and name in body and beta not in betas:
            error = {"type": "invalid_request_error",
                     "message": f"{name}: Extra inputs are not permitted"}
            return web.json_response({"type": "error", "error": error}, status=400)
    if isinstance(body, dict) and (problem := cache_problem(body)) is not None:
        error = {"type": "invalid_request_error", "message": problem}
        return web.json_response({"type": "error", "error": error}, status=400)
    if (prefill := prefilled(body)) is not None and prefill != prefill.rstrip():
        error = {"type": "invalid_request_error",
                 "message": "messages: final assistant content cannot end with trailing "
                            "whitespace"}
        return web.json_response({"type": "error", "error": error}, status=400)
    return None


def prefilled(body: Any) -> str | None:
    """The text of a final assistant message: a prefill, which the answer continues."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") != "assistant":
        return None
    content = messages[-1].get("content")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return content if isinstance(content, str) else None


class FakeAnthropic(FakeUpstream):
    """POST /v1/messages, whole or streamed (`event:` + `data:` SSE), with tool use, thinking
    and prompt caching (a body with `cache_control` marks reports cache reads and writes)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cache = PromptCache()
        self.batches = FakeMessageBatches(self)

    def reset(self) -> None:
        """Forget requests and cancels, and what the prompt cache holds."""
        super().reset()
        self.cache.clear()

    def prompt_usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """The prompt's usage: 10 input tokens, or, for a body with breakpoints, as the prompt
        cache counts them."""
        blocks = marked_blocks(body)
        if not any("cache_control" in block for block in blocks):
            return {"input_tokens": 10}
        return self.cache.usage([
            ({k: v for k, v in block.items() if k != "cache_control"},
             block["cache_control"].get("ttl", "5m") if "cache_control" in block else None)
            for block in blocks])

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        self.batches.routes(app)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        """Counts as the fakes do: words of the JSON-encoded messages and system."""
        body = await self._record(request)
        if not isinstance(body, dict) or "messages" not in body:
            return _error(400, "messages: Field required")
        if (refusal := refused(request, body)) is not None:
            return refusal
        text = json.dumps([body.get("system"), body["messages"], body.get("tools")])
        return web.json_response({"input_tokens": len(text.split())})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self.reply(request, await self._record(request))

    async def reply(self, request: web.Request, body: Any) -> web.StreamResponse:
        """Answer a Messages `body` (already recorded) as the next mode says; Vertex AI's fake
        answers its Claude calls with it."""
        if (refusal := refused(request, body)) is not None:
            return refusal
        mode = self._next_mode()
        if mode.kind == "cut" and mode.then is not None and not body.get("stream"):
            mode = mode.then
        if (prefill := prefilled(body)) is not None:  # the answer goes on from it
            text = mode.content if mode.content is not None else f"Hello from {self.name}"
            mode = replace(mode, content="".join(after_prefix(_words(text), prefill)))
        try:
            if mode.kind == "status":
                return _error(mode.code, mode.message, mode.retry_after, mode.body)
            if mode.kind == "echo" and not (body.get("stream") and mode.message != "whole"):
                return _error(mode.code, f"debug: {echoed(request)}")
            if mode.kind == "hang":
                await asyncio.sleep(3600)
            if body.get("stream"):
                return await self._stream(request, mode, body)
            return web.json_response(self._message(mode, body))
        except (asyncio.CancelledError, ConnectionResetError):
            self._count_cancel()
            raise

    def _blocks(self, mode: Mode) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if mode.reasoning:
            blocks.append({"type": "thinking", "thinking": mode.reasoning, "signature": "sig"})
        text = mode.content if mode.content is not None else f"Hello from {self.name}"
        if text:
            blocks.append({"type": "text", "text": text})
        if mode.tool:
            blocks.append({"type": "tool_use", "id": "toolu_1", "name": mode.tool[0],
                           "input": json.loads(mode.tool[1])})
        return blocks

    def _stop_reason(self, mode: Mode) -> str:
        if mode.tool:
            return "tool_use"
        if mode.finish_reason == "content_filter":  # Anthropic's classifiers stopped it
            return "refusal"
        return "max_tokens" if mode.finish_reason == "length" else "end_turn"

    def _message(self, mode: Mode, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": "msg_fake", "type": "message", "role": "assistant",
                "model": body.get("model"), "content": self._blocks(mode),
                "stop_reason": self._stop_reason(mode), "stop_sequence": None,
                "usage": {**self.prompt_usage(body), "output_tokens": 5}}

    def _events(self, mode: Mode, body: dict[str, Any]) -> list[dict[str, Any]]:
        start = self._message(mode, body)
        start = {**start, "content": [], "stop_reason": None,
                 "usage": {**start["usage"], "output_tokens": 1}}
        events: list[dict[str, Any]] = [{"type": "message_start", "message": start},
                                        {"type": "ping"}]
        for index, block in enumerate(self._blocks(mode)):
            kind = block["type"]
            opening = {**block, "text": ""} if kind == "text" else (
                {**block, "thinking": ""} if kind == "thinking" else {**block, "input": {}})
            events.append({"type": "content_block_start", "index": index,
                           "content_block": opening})
            if kind == "text":
                deltas = [{"type": "text_delta", "text": w} for w in _words(block["text"])]
            elif kind == "thinking":
                deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
            else:
                raw = json.dumps(block["input"])
                third = max(1, len(raw) // 3)
                deltas = [{"type": "input_json_delta", "partial_json": raw[i:i + third]}
                          for i in range(0, len(raw), third)]
            events += [{"type": "content_block_delta", "index": index, "delta": d}
                       for d in deltas]
            events.append({"type": "content_block_stop", "index": index})
        events += [{"type": "message_delta", "delta": {"stop_reason": self._stop_reason(mode),
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": 5}},
                   {"type": "message_stop"}]
        return events

    async def _stream(self, request: web.Request, mode: Mode,
                      body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = self._events(mode, body)
        if mode.kind == "echo":  # an error event quoting the request's headers
            kept = events[:1] if mode.message == "open" else events[:3]
            events = [*kept, {"type": "error", "error": {"type": "api_error",
                                                         "message": f"debug: {echoed(request)}"}}]
        if mode.kind == "cut":  # Anthropic reports trouble mid-stream with an error event
            kept = events[:mode.after_chunks + 2] if mode.after_chunks else []
            events = [*kept, {"type": "error", "error": {"type": "overloaded_error",
                                                         "message": "Overloaded"}}]
        for number, event in enumerate(events):
            if number and mode.delay_between_chunks:
                await asyncio.sleep(mode.delay_between_chunks)
            if event["type"] == "error" and mode.after_chunks:
                await asyncio.sleep(0.1)  # let what came before reach the client first
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                                 .encode())
        await response.write_eof()
        return response


def _anthropic_error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}},
                             status=status)


def _rfc3339(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


class FakeMessageBatches:
    """Anthropic's Message Batches: a batch is `in_progress` until it has been looked at
    `looks_to_end` times, then every request is answered as `/v1/messages` would (an invalid
    one `errored`, as Anthropic checks `params` only when it runs them); a cancel makes it
    `canceling`, and its next look ends it with the requests not run `canceled`. Each call
    needs `x-api-key` and `anthropic-version`, as Anthropic's."""

    def __init__(self, fake: FakeAnthropic, looks_to_end: int = 2) -> None:
        self.fake = fake
        self.looks_to_end = looks_to_end
        self.made: dict[str, dict[str, Any]] = {}  # id → the batch, as Anthropic shows it
        self.asked: dict[str, list[dict[str, Any]]] = {}  # id → its requests
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.looks: dict[str, int] = {}

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages/batches", self._create)
        app.router.add_get("/v1/messages/batches/{id}", self._retrieve)
        app.router.add_post("/v1/messages/batches/{id}/cancel", self._cancel)
        app.router.add_get("/v1/messages/batches/{id}/results", self._results)

    def _refused(self, request: web.Request) -> web.Response | None:
        if "x-api-key" not in request.headers:
            return _anthropic_error(401, "authentication_error", "x-api-key header is required")
        if request.headers["x-api-key"] != BATCH_KEY:
            return _anthropic_error(401, "authentication_error", "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return _anthropic_error(400, "invalid_request_error",
                                    "anthropic-version: header is required")
        return None

    async def _found(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The batch a request names, recorded and checked as Anthropic checks it; else the
        refusal to answer."""
        await self.fake._record(request)
        if (refusal := self._refused(request)) is not None:
            return refusal
        ident = request.match_info["id"]
        if ident not in self.made:
            return _anthropic_error(404, "not_found_error", f"No message batch with id {ident}")
        return self.made[ident]

    async def _create(self, request: web.Request) -> web.Response:
        body = await self.fake._record(request)
        if (refusal := self._refused(request)) is not None:
            return refusal
        asked = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(asked, list) or not asked:
            return _anthropic_error(400, "invalid_request_error",
                                    "requests: List should have at least 1 item")
        seen: set[str] = set()
        for n, item in enumerate(asked):
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
                return _anthropic_error(400, "invalid_request_error",
                                        f"requests.{n}.custom_id: String should match pattern "
                                        "'^[a-zA-Z0-9_-]{1,64}$'")
            if custom_id in seen or not isinstance(item.get("params"), dict):
                return _anthropic_error(400, "invalid_request_error",
                                        f"requests.{n}: custom_id must be unique and params "
                                        "an object")
            seen.add(custom_id)
        now = datetime.now(UTC)
        ident = f"msgbatch_{secrets.token_hex(12)}"
        self.made[ident] = {
            "id": ident, "type": "message_batch", "processing_status": "in_progress",
            "request_counts": {"processing": len(asked), "succeeded": 0, "errored": 0,
                               "canceled": 0, "expired": 0},
            "ended_at": None, "created_at": _rfc3339(now),
            "expires_at": _rfc3339(now + timedelta(days=1)), "archived_at": None,
            "cancel_initiated_at": None, "results_url": None}
        self.asked[ident], self.looks[ident] = asked, 0
        return web.json_response(self.made[ident])

    async def _retrieve(self, request: web.Request) -> web.Response:
        batch = await self._found(request)
        if isinstance(batch, web.Response):
            return batch
        self.looks[batch["id"]] += 1
        if batch["processing_status"] == "canceling" \
                or (batch["processing_status"] == "in_progress"
                    and self.looks[batch["id"]] >= self.looks_to_end):
            self._end(batch, f"{request.scheme}://{request.host}")
        return web.json_response(batch)

    async def _cancel(self, request: web.Request) -> web.Response:
        batch = await self._found(request)
        if isinstance(batch, web.Response):
            return batch
        if batch["processing_status"] == "in_progress":
            batch.update(processing_status="canceling",
                         cancel_initiated_at=_rfc3339(datetime.now(UTC)))
        return web.json_response(batch)

    async def _results(self, request: web.Request) -> web.Response:
        batch = await self._found(request)
        if isinstance(batch, web.Response):
            return batch
        if batch["processing_status"] != "ended":
            return _anthropic_error(400, "invalid_request_error",
                                    f"Message Batch {batch['id']} has not yet ended")
        text = "".join(json.dumps(line) + "\n" for line in self.results[batch["id"]])
        return web.Response(body=text.encode(), content_type="application/binary")

    def _end(self, batch: dict[str, Any], origin: str) -> None:
        """Run (or, once a cancel was asked, cancel) every request, and end the batch."""
        cancelled = batch["processing_status"] == "canceling"
        results = [{"custom_id": item["custom_id"],
                    "result": {"type": "canceled"} if cancelled else self._run(item["params"])}
                   for item in self.asked[batch["id"]]]
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        for line in results:
            counts[line["result"]["type"]] += 1
        self.results[batch["id"]] = results
        batch.update(processing_status="ended", request_counts=counts,
                     ended_at=_rfc3339(datetime.now(UTC)),
                     results_url=f"{origin}/v1/messages/batches/{batch['id']}/results")

    def _run(self, params: dict[str, Any]) -> dict[str, Any]:
        """One request's result, as `/v1/messages` would answer it."""
        missing = [name for name in ("model", "max_tokens", "messages") if name not in params]
        problem = f"{missing[0]}: Field required" if missing else cache_problem(params)
        if problem is None and params.get("stream"):
            problem = "stream: Streaming is not supported in batches"
        kind = "invalid_request_error"
        if problem is None and self.fake.models and params["model"] not in self.fake.models:
            kind, problem = "not_found_error", f"model: {params['model']}"
        if problem is not None:
            return {"type": "errored", "error": {"type": "error", "error": {
                "type": kind, "message": problem}, "request_id": f"req_{secrets.token_hex(8)}"}}
        message = self.fake._message(self.fake._next_mode(), params)
        return {"type": "succeeded", "message": {**message, "id": f"msg_{secrets.token_hex(8)}"}}
