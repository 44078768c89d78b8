"""The response cache (opt-in per alias: `cache.ttl`): identical requests answered once.

Exact match on the alias and the whole body, except what does not change the answer's content
(`stream`, `stream_options`, `user`), and on the key that asked when keys are configured. Only
complete, successful answers are kept: a whole answer as its bytes, a stream as the bytes the
client got. Either serves either: a stream request hitting a whole answer gets it as chunks
(`chunks_of`), a whole request hitting a stream gets it assembled (`gateway.adapters.assemble`).
Kept in a `gateway.stores.kept.Kept`: in memory (bounded by bytes, least recently used out first),
and with the Redis state backend in Redis too, so replicas share hits. Redis trouble is a miss,
never a failure.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.assemble import ChatAssembler, CompletionAssembler
from gateway.core import endpoints
from gateway.core.streaming import DONE_EVENT
from gateway.stores.kept import Kept
from providers.contract.answer import check_json
from providers.contract.errors import ProviderError
from providers.contract.stream import SSEWatch, check_head

if TYPE_CHECKING:
    from redis.asyncio import Redis

ENDPOINTS = endpoints.STREAMED_WHOLE
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


class _ToolCall(msgspec.Struct):
    pass


class _Message(msgspec.Struct):
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None


class _Whole(msgspec.Struct):
    """What `chunks_of` reads of a kept whole answer, beyond what `check_json` types."""

    choices: list[_Choice] | None = None


_WHOLE = msgspec.json.Decoder(_Whole)


def sound(cached: Cached) -> bool:
    """Whether a kept entry can be served: one form, read as strictly as an upstream answer (a
    whole one by `check_json`, a stream by the SSE watch, to its `[DONE]` with every choice
    finished). Redis is shared: what another writer left there must not reach a client."""
    if cached.endpoint not in ENDPOINTS or (cached.body is None) == (cached.chunks is None):
        return False
    try:
        if cached.body is not None:
            check_json(cached.body)
            _WHOLE.decode(cached.body)
            if not cached.body.isascii():  # msgspec leaves the strings it skips unchecked
                cached.body.decode("utf-8")
            return True
        watch = SSEWatch()
        watch.feed(cached.chunks or b"")
        watch.end()
        check_head(watch)
    except (ProviderError, msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return False
    return watch.done and watch.finished and watch.error_event is None


def key_of(endpoint: str, alias: str, body: Mapping[str, Any], scope: str | None,
           betas: Sequence[str] = ()) -> str:
    """The cache key: the alias, the body without `_IGNORED` fields, who asked, and the betas
    that may reach an upstream with it (a beta changes what the same body answers)."""
    kept = {name: value for name, value in body.items() if name not in _IGNORED}
    named: list[Any] = [endpoint, alias, scope, kept]
    if betas:  # a request without betas keeps the key it always had
        named.append(sorted(betas))
    identity = msgspec.json.encode(named, order="sorted")
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
    """Kept answers (`gateway.stores.kept`): at most `max_bytes` in this process, least
    recently used out first; with the process's Redis client, in Redis too for each answer's
    time to live."""

    def __init__(self, max_bytes: int, max_entry_bytes: int,
                 redis: Redis | None = None, prefix: str = "",
                 max_entries: int | None = None) -> None:
        self.kept = Kept(max_bytes, max_entry_bytes, redis, f"{prefix}cache:", max_entries)

    @property
    def max_entry_bytes(self) -> int:
        """The largest answer kept (a stream past it is not gathered: `gateway.pipeline.relay`)."""
        return self.kept.max_entry_bytes

    async def get(self, key: str) -> Cached | None:
        """The entry kept for `key`, if it is still fresh and sound; an unsound one is deleted."""
        # What this process holds was written by it, or checked when it came from Redis.
        trusted = (encoded := self.kept.held(key)) is not None
        if encoded is None and (encoded := await self.kept.get(key)) is None:
            return None
        found = _decoded(encoded)
        if found is None or not (trusted or sound(found)):
            await self.kept.delete(key)  # in Redis too: no replica should read it again
            return None
        if found.expires <= time.time():
            self.kept.forget(key)
            return None
        self.kept.keep(key, encoded)  # most recently used; held here if it came from Redis
        return found

    async def drop(self, key: str) -> None:
        """Forget an entry here and in Redis."""
        await self.kept.delete(key)

    async def put(self, key: str, cached: Cached) -> int:
        """Keep an answer; the bytes it takes (0 when it is too large to keep)."""
        encoded = msgspec.json.encode(cached)
        kept = await self.kept.put(key, encoded, cached.expires - time.time())
        return len(encoded) if kept else 0

    # Last in the class: above it, `bytes` in an annotation would name this property.
    @property
    def bytes(self) -> int:
        """The bytes held in this process."""
        return self.kept.bytes


def _decoded(encoded: bytes) -> Cached | None:
    try:
        return _CACHED.decode(encoded)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # not what this gateway writes: a miss
