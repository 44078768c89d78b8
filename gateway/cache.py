"""The response cache (opt-in per alias: `cache.ttl`): identical requests answered once.

Exact match on the alias and the whole body, except what does not change the answer's content
(`stream`, `stream_options`, `user`), and on the key that asked when keys are configured. Only
complete, successful answers are kept: a whole answer as its bytes, a stream as the bytes the
client got. Either serves either: a stream request hitting a whole answer gets it as chunks
(`chunks_of`), a whole request hitting a stream gets it assembled (`gateway.assemble`). In memory
by default (bounded by bytes, least recently used out first); with the Redis state backend in
Redis too, so replicas share hits. Redis trouble is a miss, never a failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.assemble import ChatAssembler, CompletionAssembler
from gateway.streaming import DONE_EVENT

ENDPOINTS = frozenset({"chat/completions", "completions"})
# Fields that do not change what the answer says.
_IGNORED = frozenset({"stream", "stream_options", "user"})


class Cached(msgspec.Struct, frozen=True):
    """One kept answer: whole (`body`) or streamed (`chunks`, and whether it has usage)."""

    endpoint: str
    provider: str
    expires: float
    body: bytes | None = None
    chunks: bytes | None = None
    stream_usage: bool = False


def key_of(endpoint: str, alias: str, body: Mapping[str, Any], scope: str | None) -> str:
    """The cache key: the alias, the body without `_IGNORED` fields, and who asked."""
    kept = {name: value for name, value in body.items() if name not in _IGNORED}
    identity = msgspec.json.encode([endpoint, alias, scope, kept], order="sorted")
    return hashlib.sha256(identity).hexdigest()


def bypassed(headers: Mapping[str, str]) -> tuple[bool, bool]:
    """(read, write) as the client's `Cache-Control` allows: `no-cache` skips reading,
    `no-store` skips both."""
    directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
    no_store = "no-store" in directives
    return (not (no_store or "no-cache" in directives)), not no_store


def whole_of(cached: Cached) -> bytes | None:
    """The answer whole, assembled when it was kept as a stream."""
    if cached.body is not None:
        return cached.body
    if cached.chunks is None:
        return None
    assembler = ChatAssembler() if cached.endpoint == "chat/completions" \
        else CompletionAssembler()
    assembler.feed(cached.chunks)
    return msgspec.json.encode(assembler.answer())


def stream_of(cached: Cached, wants_usage: bool) -> bytes | None:
    """The answer as a stream: the same chunks when it was kept as one (None when they lack
    the usage event the client asks for), else made from the whole answer."""
    if cached.chunks is not None:
        return cached.chunks if cached.stream_usage or not wants_usage else None
    if cached.body is None:
        return None
    return chunks_of(msgspec.json.decode(cached.body), cached.endpoint, wants_usage)


def chunks_of(answer: Mapping[str, Any], endpoint: str, wants_usage: bool) -> bytes:
    """A whole answer as the SSE chunks that assemble into it, `[DONE]` last."""
    chat = endpoint == "chat/completions"
    top = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint")
           if k in answer}
    top["object"] = "chat.completion.chunk" if chat else "text_completion"
    events = []
    for choice in answer.get("choices") or ():
        index = choice.get("index", 0)
        if chat:
            message = dict(choice.get("message") or {})
            message = {k: v for k, v in message.items() if v is not None}
            body = {"index": index, "delta": message, "logprobs": choice.get("logprobs"),
                    "finish_reason": None}
            if "tool_calls" in message:
                message["tool_calls"] = [{**call, "index": n}
                                         for n, call in enumerate(message["tool_calls"])]
        else:
            body = {"index": index, "text": choice.get("text", ""),
                    "logprobs": choice.get("logprobs"), "finish_reason": None}
        events.append({**top, "choices": [body]})
        ending: dict[str, Any] = {"index": index, "finish_reason": choice.get("finish_reason"),
                                  "logprobs": None}
        if chat:
            ending["delta"] = {}
        else:
            ending["text"] = ""
        events.append({**top, "choices": [ending]})
    if wants_usage and answer.get("usage"):
        events.append({**top, "choices": [], "usage": answer["usage"]})
    return b"".join(b"data: " + msgspec.json.encode(e) + b"\n\n" for e in events) + DONE_EVENT


_CACHED = msgspec.json.Decoder(Cached)


class ResponseCache:
    """Kept answers in this process: at most `max_bytes`, least recently used out first."""

    def __init__(self, max_bytes: int, max_entry_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_entry_bytes
        self.bytes = 0
        self._kept: OrderedDict[str, bytes] = OrderedDict()

    async def get(self, key: str) -> Cached | None:
        encoded = self._kept.get(key)
        if encoded is None:
            return None
        found = _decoded(encoded)
        if found is None or found.expires <= time.time():
            self._drop(key)
            return None
        self._kept.move_to_end(key)
        return found

    async def put(self, key: str, cached: Cached) -> int:
        """Keep an answer; the bytes it takes (0 when it is too large to keep)."""
        encoded = msgspec.json.encode(cached)
        if len(encoded) > self.max_entry_bytes:
            return 0
        self._keep(key, encoded)
        return len(encoded)

    def _keep(self, key: str, encoded: bytes) -> None:
        self._drop(key)
        self._kept[key] = encoded
        self.bytes += len(encoded)
        while self.bytes > self.max_bytes:
            _, evicted = self._kept.popitem(last=False)
            self.bytes -= len(evicted)

    def _drop(self, key: str) -> None:
        if (old := self._kept.pop(key, None)) is not None:
            self.bytes -= len(old)

    async def close(self) -> None:
        """Release connections, if any."""


def _decoded(encoded: bytes) -> Cached | None:
    try:
        return _CACHED.decode(encoded)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # not what this gateway writes: a miss


class RedisResponseCache(ResponseCache):
    """Also in Redis, with the answer's time to live, shared by every replica."""

    def __init__(self, url: str, prefix: str, max_bytes: int, max_entry_bytes: int) -> None:
        super().__init__(max_bytes, max_entry_bytes)
        self.prefix = f"{prefix}cache:"
        self._client = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)

    async def get(self, key: str) -> Cached | None:
        if (found := await super().get(key)) is not None:
            return found
        try:
            stored = await self._client.get(self.prefix + key)
        except (RedisError, OSError):
            return None
        if not isinstance(stored, bytes) or len(stored) > self.max_entry_bytes:
            return None
        found = _decoded(stored)
        if found is None or found.expires <= time.time():
            return None
        self._keep(key, stored)
        return found

    async def put(self, key: str, cached: Cached) -> int:
        size = await super().put(key, cached)
        ttl = cached.expires - time.time()
        if size and ttl > 0:
            with contextlib.suppress(RedisError, OSError):
                await self._client.set(self.prefix + key, msgspec.json.encode(cached),
                                       px=max(1, int(ttl * 1000)))
        return size

    async def close(self) -> None:
        await self._client.aclose()
