"""SSE relay: peek before commit, pass bytes through, end every stream honestly.

Until the first data event arrives nothing has been sent, so a failure is still a failover.
After it, upstream bytes go to the client as they come; if the upstream breaks or stops before
it said it was done, the client gets an in-band `data: {"error": ...}` event instead of a silent
truncation. The watcher parses only what that needs: event boundaries, `[DONE]`, a
`finish_reason`, an upstream error event.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from providers.contract.errors import (
    BadUpstreamResponse,
    GatewayError,
    ProviderError,
    ProviderUnavailable,
    sse_error_event,
)
from providers.contract.log import get_logger
from providers.contract.messages import usage_of
from providers.contract.redact import Redactor, mask_credentials
from providers.contract.usage import Usage, from_payload

DONE_EVENT = b"data: [DONE]\n\n"
# A Responses API stream is over once the response completed, stopped short, or failed; a
# Messages API stream once its message stopped.
_RESPONSE_ENDED = frozenset({"response.completed", "response.incomplete", "response.failed",
                             "message_stop"})
# Messages API events that carry usage: counted the Messages way (`_MessagesUsage`).
_MESSAGES_USAGE = frozenset({"message_start", "message_delta"})
_SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
_MAX_LINE = 1 << 20  # a "line" longer than this is not SSE
MAX_EVENT_TEXT = 4096  # of an upstream error event, what is read for the failover's reason
# How long the relay waits, after the upstream's last event, for the end of its body.
END_OF_BODY_GRACE = 0.25


class _Choice(msgspec.Struct):
    index: int = 0
    finish_reason: str | None = None


class _Event(msgspec.Struct):
    """What the watch reads of a data event; checking these types checks the whole event is
    JSON (raw fields are scanned, not built)."""

    choices: list[_Choice] | None = None
    type: str | None = None
    object: str | None = None
    error: msgspec.Raw = msgspec.Raw()


class _StartedMessage(msgspec.Struct):
    usage: dict[str, Any] | None = None


class _MessagesUsage(msgspec.Struct):
    message: _StartedMessage | None = None
    usage: dict[str, Any] | None = None


_EVENTS = msgspec.json.Decoder(_Event)
_MESSAGES_USAGE_EVENTS = msgspec.json.Decoder(_MessagesUsage)
_UNREADABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


@dataclass(slots=True)
class SSEWatch:
    """Reads an SSE byte stream alongside the relay, line by line, without changing it.

    It is checked as it goes: bytes that are not UTF-8, a data event that is not a JSON object
    of the expected shape (`malformed`), lines that are not SSE (`garbage`). A stream is
    `finished` once every choice it started, and each of the `choices` the request asked for,
    has a `finish_reason`."""

    choices: int = 1  # the request's `n`: choices the stream owes even if it never starts them
    data_events: int = 0
    done: bool = False
    error_event: bytes | None = None
    garbage: bool = False
    malformed: bool = False
    usage: Usage | None = None
    _partial: bytes = field(default=b"", repr=False)
    _messages_usage: dict[str, Any] = field(default_factory=dict, repr=False)
    _started: set[int] = field(default_factory=set, repr=False)
    _ended: set[int] = field(default_factory=set, repr=False)
    _utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(), repr=False)

    @property
    def finished(self) -> bool:
        """Every choice seen has ended."""
        return (bool(self._started) and self._started <= self._ended
                and len(self._ended) >= self.choices)

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the stream."""
        try:
            self._utf8.decode(chunk)
        except UnicodeDecodeError:
            self.malformed = True
        buffer = self._partial + chunk if self._partial else chunk
        lines = buffer.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_LINE:
            self.garbage = True
            self._partial = b""
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line:
            return
        if not line.startswith(_SSE_FIELDS):
            self.garbage = True
            return
        if not line.startswith(b"data:"):
            return  # a comment, an event name: no progress, no content
        payload = line[5:].lstrip()
        self.data_events += 1
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            event = _EVENTS.decode(payload)
        except _UNREADABLE:
            self.malformed = True
            return
        if len(event.error) or event.object == "error":
            self.error_event = payload
            return
        if event.type is not None and event.type in _RESPONSE_ENDED:
            self.done = True
        if event.type is not None and event.type in _MESSAGES_USAGE:
            self._count_messages_usage(payload)
            return
        for choice in event.choices or ():
            self._started.add(choice.index)
            if choice.finish_reason is not None:
                self._ended.add(choice.index)
        if b'"usage"' in payload and (usage := from_payload(payload)) is not None:
            self.usage = usage


    def _count_messages_usage(self, payload: bytes) -> None:
        """A Messages stream gives input tokens at its start and output tokens at its end."""
        found = _MESSAGES_USAGE_EVENTS.decode(payload)
        given = found.usage or (found.message.usage if found.message else None)
        if given:
            self._messages_usage.update({k: v for k, v in given.items() if v is not None})
            self.usage = msgspec.convert(usage_of(self._messages_usage), Usage)


@dataclass(slots=True)
class OpenedStream:
    """An upstream stream that has produced its first data event and can be committed to."""

    head: bytes
    rest: AsyncIterator[bytes]
    watch: SSEWatch


async def open_stream(chunks: AsyncIterator[bytes], choices: int = 1) -> OpenedStream:
    """Read until the first data event; anything wrong until then is a `ProviderError`.
    `choices` is the request's `n`: the stream is finished only when that many have ended."""
    watch = SSEWatch(choices=choices)
    head = b""
    try:
        async for chunk in chunks:
            watch.feed(chunk)
            head += chunk
            if watch.garbage:
                raise BadUpstreamResponse("stream is not server-sent events")
            if watch.malformed:
                raise BadUpstreamResponse("stream event is not a JSON answer chunk (or not "
                                          "UTF-8)")
            if watch.error_event is not None:  # it may echo the request's headers
                said = mask_credentials(watch.error_event[:MAX_EVENT_TEXT].decode("utf-8",
                                                                                  "replace"))
                raise ProviderUnavailable("stream began with an error event: " + said[:300])
            if watch.data_events:
                return OpenedStream(head, chunks, watch)
        raise BadUpstreamResponse("stream ended before its first event")
    except BaseException:
        await close_quietly(chunks)
        raise


async def relay(opened: OpenedStream, provider: str,
                on_end: Callable[[str, Usage | None], None] | None = None,
                strip_usage: bool = False,
                redactor: Redactor | None = None,
                error_event: Callable[[GatewayError], bytes] = sse_error_event,
                ) -> AsyncGenerator[bytes, None]:
    """Pass the stream through; end it with `[DONE]` or an in-band error, never silently.

    `on_end` hears how it ended ("completed", "error" or "client_disconnected") and the
    `usage` the stream reported, if any. `strip_usage` drops the usage-only event the gateway
    asked for on the client's behalf. The in-band error (`error_event`: the endpoint's shape)
    passes `redactor` (it carries upstream text); the upstream's own bytes are relayed as
    they are.
    """
    watch = opened.watch
    outcome = "client_disconnected"
    sent = b""
    try:
        head = opened.head  # may hold the whole answer when the upstream was quick
        yield (sent := drop_usage_events(head) if strip_usage and b'"usage"' in head else head)
        if not watch.done:
            async for chunk in opened.rest:
                if passed := _passed(chunk, watch, strip_usage, redactor):
                    sent = passed  # only its end is kept: see _own_line
                    yield passed
                if watch.done:
                    break
        if watch.done:
            await read_to_end(opened.rest)
        outcome, last = ending(watch, provider, error_event)
        if last:
            yield (_own_line(sent) if outcome == "error" else b"") + last
    except (ProviderError, *UNREADABLE_ANSWER) as exc:
        outcome = "error"
        if not isinstance(exc, ProviderError):  # a kind could not translate what came
            exc = unreadable(provider, exc)
        event = error_event(_mid_stream(provider, exc))
        yield _own_line(sent) + (redactor.encoded(event) if redactor is not None else event)
    except Exception:  # a bug: the client still learns the stream did not finish
        outcome = "error"
        get_logger().exception("unhandled_stream_error", provider=provider)
        yield _own_line(sent) + error_event(GatewayError("Internal gateway error"))
    finally:
        await close_quietly(opened.rest)
        if on_end is not None:
            on_end(outcome, watch.usage)


def _own_line(sent: bytes) -> bytes:
    """What starts the gateway's own event on a line of its own, after what was relayed last
    (half an upstream line the gateway could not yet judge, when the upstream lied)."""
    return b"" if not sent or sent.endswith(b"\n\n") else b"\n\n"


# What a kind's translation of an upstream answer raises when the answer has a shape it did
# not expect (a list where an object belongs): the upstream's fault, not the gateway's.
UNREADABLE_ANSWER = (TypeError, ValueError, KeyError, AttributeError, IndexError,
                     msgspec.MsgspecError)


def unreadable(provider: str, exc: BaseException) -> BadUpstreamResponse:
    """The failover error for an answer a kind could not read; its traceback is logged."""
    get_logger().warning("upstream_answer_unreadable", provider=provider,
                         error=type(exc).__name__, exc_info=exc)
    return BadUpstreamResponse(f"answer could not be read ({type(exc).__name__})")


def _passed(chunk: bytes, watch: SSEWatch, strip_usage: bool, redactor: Redactor | None
            ) -> bytes:
    """An upstream chunk as the client gets it, once the watch has read it; never what the
    client could not parse."""
    watch.feed(chunk)
    if watch.malformed:
        raise BadUpstreamResponse("stream event is not a JSON answer chunk (or not UTF-8)")
    if watch.error_event is not None:  # the upstream's own error event: it may quote the
        chunk = _scrubbed(chunk, redactor)  # request's credentials
    if strip_usage and b'"usage"' in chunk:
        chunk = drop_usage_events(chunk)
    return chunk


def ending(watch: SSEWatch, provider: str,
           error_event: Callable[[GatewayError], bytes] = sse_error_event) -> tuple[str, bytes]:
    """How a stream whose upstream body is over ended, and the last bytes the client gets:
    `[DONE]` when the upstream finished but did not say so, an in-band error when it had not
    finished."""
    if watch.done:
        return "completed", b""
    if watch.finished and not watch.garbage:
        return "completed", DONE_EVENT
    return "error", error_event(
        _mid_stream(provider, ProviderUnavailable("stream ended before it finished")))


async def read_to_end(rest: AsyncIterator[bytes]) -> None:
    """Read, and drop, what the upstream sends after its last event: normally only the end of
    its body, which frees its connection for the next request. Closed unread, the connection
    would be closed too, and every stream would pay a new connect (a TLS handshake to a remote
    API). Servers such as uvicorn send that end in a write of its own; gives up after
    `END_OF_BODY_GRACE`, as a client of the upstream alone would not wait forever either."""
    with contextlib.suppress(TimeoutError, ProviderError):
        async with asyncio.timeout(END_OF_BODY_GRACE):
            async for _ in rest:
                pass


_USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def drop_usage_events(chunk: bytes) -> bytes:
    """Remove whole `data:` events that carry only usage (`"choices": []`) from a chunk."""
    events = chunk.split(b"\n\n")
    kept = [e for e in events if not (b'"usage"' in e and _USAGE_ONLY.search(e)
                                      and e.lstrip().startswith(b"data:"))]
    return b"\n\n".join(kept) if len(kept) != len(events) else chunk


def _scrubbed(chunk: bytes, redactor: Redactor | None) -> bytes:
    text = mask_credentials(chunk.decode("utf-8", "replace")).encode()
    return redactor.encoded(text) if redactor is not None else text


def _mid_stream(provider: str, exc: ProviderError) -> GatewayError:
    error = ProviderUnavailable(f"provider '{provider}' failed mid-stream: {exc.reason}: "
                                f"{exc.message}")
    error.upstream_status = exc.upstream_status
    return error


async def close_quietly(chunks: AsyncIterator[bytes]) -> None:
    """Close an upstream iterator even while being cancelled; its response closes synchronously."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is None or getattr(chunks, "ag_frame", True) is None:
        return  # an async generator that already finished: nothing to close, no scope to pay
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            await aclose()
