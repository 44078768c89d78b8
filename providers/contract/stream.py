"""A peeked stream: an upstream SSE stream read up to its first data event, and its watch.

Until the first data event arrives nothing has been sent, so a failure is still a failover:
`open_stream` reads that far and hands back an `Opened` stream (or raises a `ProviderError`).
Its `watch` then reads every later chunk beside whoever consumes it, without changing it, and
says what the consumer needs: the stream is done (`[DONE]`, a terminal event), every choice
finished, an upstream error event, bytes that are not SSE or not a JSON event, the usage.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import msgspec

from providers.contract.errors import BadUpstreamResponse, ProviderError, ProviderUnavailable
from providers.contract.log import get_logger
from providers.contract.messages import usage_of
from providers.contract.redact import mask_credentials
from providers.contract.usage import Usage, from_payload
from providers.wire import sse
from providers.wire.expiry import Expiry

# A Responses API stream is over once the response completed, stopped short, or failed; a
# Messages API stream once its message stopped.
_ENDED = frozenset({"response.completed", "response.incomplete", "response.failed",
                    "message_stop"})
# Messages API events that carry usage: counted the Messages way (`_MessagesUsage`).
_MESSAGES_USAGE = frozenset({"message_start", "message_delta"})
MAX_EVENT_TEXT = 4096  # of an upstream error event, what is read for the failover's reason
# How long a reader waits, after the upstream's last event, for the end of its body.
END_OF_BODY_GRACE = 0.25
# What a kind's translation of an upstream answer raises when the answer has a shape it did
# not expect (a list where an object belongs): the upstream's fault, not the gateway's.
UNREADABLE_ANSWER = (TypeError, ValueError, KeyError, AttributeError, IndexError,
                     msgspec.MsgspecError)
# How many events `settle` reads ahead at most: those that write nothing (a role, a provider's
# filter results, usage) are few before the first content of any stream.
MAX_SETTLING_EVENTS = 32
_UNDECODABLE = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)


class Watch(Protocol):
    """What reads a stream's chunks beside its consumer, and what it tells of them."""

    @property
    def data_events(self) -> int: ...
    @property
    def garbage(self) -> bool: ...
    @property
    def malformed(self) -> bool: ...
    @property
    def error_event(self) -> bytes | None: ...

    def feed(self, chunk: bytes) -> None: ...


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


class SSEWatch(msgspec.Struct):
    """The watch of a relayed stream: each data event decoded once, into what it must tell.

    A stream is `finished` once every choice it started, and each of the `choices` the request
    asked for, has a `finish_reason`. A Struct: one is made for every stream, and a dataclass
    runs its defaults' factories in Python."""

    choices: int = 1  # the request's `n`: choices the stream owes even if it never starts them
    data_events: int = 0
    done: bool = False
    error_event: bytes | None = None
    malformed: bool = False
    usage: Usage | None = None
    reader: sse.Reader = msgspec.field(default_factory=sse.Reader)
    _messages_usage: dict[str, Any] = msgspec.field(default_factory=dict)
    _started: set[int] = msgspec.field(default_factory=set)
    _ended: set[int] = msgspec.field(default_factory=set)
    _utf8: codecs.IncrementalDecoder = msgspec.field(
        default_factory=codecs.getincrementaldecoder("utf-8"))

    @property
    def garbage(self) -> bool:
        """Lines that are not server-sent events came."""
        return self.reader.garbage

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
        for data in self.reader.data(chunk):
            self._event(data)

    def end(self) -> None:
        """The body is over: an event it did not close with a blank line counts too."""
        for event in self.reader.flush():
            self._event(event.data)

    def _event(self, payload: bytes) -> None:
        self.data_events += 1
        if payload == sse.DONE:
            self.done = True
            return
        try:
            event = _EVENTS.decode(payload)
        except _UNDECODABLE:
            self.malformed = True
            return
        if len(event.error) or event.object == "error":
            self.error_event = payload
            return
        if event.type is not None and event.type in _ENDED:
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
class Opened:
    """A stream that has produced its first data event: its first bytes, the rest, its watch.
    Whoever takes it owns it: it reads it to its end or `close()`s it."""

    head: bytes
    rest: AsyncIterator[bytes]
    watch: SSEWatch
    # An answer that is not a chat's event stream (audio bytes): its media type; it is relayed
    # as it comes, unread (`flowing`), and its watch sees nothing.
    media_type: str | None = None

    async def close(self) -> None:
        """Stop reading: the upstream request is closed, even while being cancelled."""
        await close_quietly(self.rest)


async def open_stream(chunks: AsyncIterator[bytes], choices: int = 1,
                      watch: Watch | None = None) -> tuple[bytes, Watch]:
    """Read `chunks` until their first data event, each chunk fed to `watch` (an `SSEWatch`
    by default); anything wrong until then is a `ProviderError`, and `chunks` is closed.
    `choices` is the request's `n`."""
    watching: Watch = watch if watch is not None else SSEWatch(choices=choices)
    head = b""
    try:
        async for chunk in chunks:
            watching.feed(chunk)
            head += chunk
            check_head(watching)
            if watching.data_events:
                return head, watching
        raise BadUpstreamResponse("stream ended before its first event")
    except BaseException:
        await close_quietly(chunks)
        raise


async def peek(chunks: AsyncIterator[bytes], choices: int = 1) -> Opened:
    """`chunks` read to their first data event, watched by an `SSEWatch`."""
    head, watch = await open_stream(chunks, choices)
    assert isinstance(watch, SSEWatch)
    return Opened(head, chunks, watch)


async def flowing(chunks: AsyncIterator[bytes], media_type: str) -> Opened:
    """`chunks` (bytes of any kind: audio) read to their first non-empty chunk, so a failure
    until then is still a failover; an empty body is a bad answer."""
    try:
        async for chunk in chunks:
            if chunk:
                return Opened(chunk, chunks, SSEWatch(), media_type)
        raise BadUpstreamResponse("answer ended before its first byte")
    except BaseException:
        await close_quietly(chunks)
        raise


async def settle(opened: Opened, says: Callable[[bytes], bool | None],
                 most: int = MAX_SETTLING_EVENTS) -> bool:
    """Whether `says` is True of the first event of `opened` that settles it (True or False;
    None: not yet): the events at hand first, then read on until one settles it, `[DONE]`,
    the end of the stream, or `most` events. What was read ahead is given back first, unread
    (its consumer's watch reads it then), so nothing waits longer than for that event."""
    reader = sse.Reader()
    events = 0
    for event in reader.feed(opened.head):
        events += 1
        settled = False if event.done else says(event.data)
        if settled is not None:
            return settled
    read: list[bytes] = []
    settled = None
    failure: Exception | None = None
    try:
        while settled is None and events < most:
            try:
                chunk = await anext(opened.rest)
            except StopAsyncIteration:
                break
            read.append(chunk)
            for event in reader.feed(chunk):
                events += 1
                settled = False if event.done else says(event.data)
                if settled is not None:
                    break
    except (ProviderError, *UNREADABLE_ANSWER) as exc:  # a break: the consumer's to report
        failure = exc.with_traceback(None)  # its frames hold `opened`: no cycle through it
    if read or failure is not None:
        opened.rest = _Ahead(read, failure, opened.rest)
    return bool(settled)


class _Ahead:
    """Chunks read ahead of a stream's consumer, given back first, then the error that ended
    the reading (if one did), then the rest."""

    def __init__(self, read: list[bytes], failure: Exception | None,
                 rest: AsyncIterator[bytes]) -> None:
        self._read = read
        self._failure = failure
        self._rest = rest

    def __aiter__(self) -> _Ahead:
        return self

    async def __anext__(self) -> bytes:
        if self._read:
            return self._read.pop(0)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        return await anext(self._rest)

    async def aclose(self) -> None:
        await close_quietly(self._rest)


def event_object(data: bytes) -> dict[str, Any] | None:
    """A native stream event's JSON object, None for an empty event; BadUpstreamResponse for
    anything else (a failover before the first token, an in-band error after)."""
    if not data or data.isspace():
        return None
    try:
        payload = msgspec.json.decode(data)
    except msgspec.DecodeError:
        raise BadUpstreamResponse(f"stream event is not JSON: {data[:80]!r}") from None
    if not isinstance(payload, dict):
        raise BadUpstreamResponse("stream event is not a JSON object")
    return payload


def check_head(watch: Watch) -> None:
    """Raise the failover error for what the watch saw wrong before a stream is committed."""
    if watch.garbage:
        raise BadUpstreamResponse("stream is not server-sent events")
    if watch.malformed:
        raise BadUpstreamResponse("stream event is not a JSON answer chunk (or not UTF-8)")
    if watch.error_event is not None:  # it may echo the request's headers
        said = mask_credentials(watch.error_event[:MAX_EVENT_TEXT].decode("utf-8", "replace"))
        raise ProviderUnavailable("stream began with an error event: " + said[:300])


def unreadable(provider: str, exc: BaseException) -> BadUpstreamResponse:
    """The failover error for an answer a kind could not read; its traceback is logged."""
    get_logger().warning("upstream_answer_unreadable", provider=provider,
                         error=type(exc).__name__, exc_info=exc)
    return BadUpstreamResponse(f"answer could not be read ({type(exc).__name__})")


async def read_to_end(rest: AsyncIterator[bytes]) -> None:
    """Read, and drop, what the upstream sends after its last event: normally only the end of
    its body, which frees its connection for the next request. Closed unread, the connection
    would be closed too, and every stream would pay a new connect (a TLS handshake to a remote
    API). Servers such as uvicorn send that end in a write of its own; gives up after
    `END_OF_BODY_GRACE`, as a client of the upstream alone would not wait forever either.
    One timer, told apart from any other cancellation as `asyncio.timeout` tells its own
    (`Expiry`), without that context manager's frames and state: every stream pays for it."""
    task = asyncio.current_task()
    assert task is not None, "awaited in a task"
    loop = asyncio.get_running_loop()
    grace = Expiry(task, loop.time() + END_OF_BODY_GRACE)
    timer = loop.call_at(grace.due, grace.expire)
    try:
        async for _ in rest:
            pass
    except (TimeoutError, ProviderError):
        pass
    except asyncio.CancelledError:
        if not grace.lapsed():
            raise
    finally:
        timer.cancel()


async def close_quietly(chunks: AsyncIterator[bytes]) -> None:
    """Close an upstream iterator even while being cancelled; its response closes synchronously."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is None or getattr(chunks, "ag_frame", True) is None:
        return  # an async generator that already finished: nothing to close, no scope to pay
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            await aclose()
