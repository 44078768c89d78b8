"""A fake Anthropic Messages API: the same modes as `FakeUpstream`, in Anthropic's wire format."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

from aiohttp import web

from tests.upstream import FakeUpstream, Mode, _error, _words, after_prefix, echoed

OVERLOADED = json.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                    "message": "Overloaded"}})
# Fields Anthropic refuses ("Extra inputs are not permitted") unless a beta names them.
BETA_FIELDS = {"context_management": "context-management-"}
MAX_BREAKPOINTS = 4  # blocks marked `cache_control` Anthropic takes in one request
TTLS = ("5m", "1h")


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
        for event in events:
            if event["type"] == "error" and mode.after_chunks:
                await asyncio.sleep(0.1)  # let what came before reach the client first
            await response.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                                 .encode())
        await response.write_eof()
        return response
