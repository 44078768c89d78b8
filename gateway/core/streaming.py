"""The stream sent to a client: upstream bytes passed through, every stream ended honestly.

The upstream stream arrives peeked (`providers.contract.stream.Opened`): its first data event
is at hand, so the client can be committed to. After it, upstream bytes go to the client as
they come; if the upstream breaks or stops before it said it was done, the client gets an
in-band error event instead of a silent truncation. The stream's record (`gateway.core.record`)
hears how it ended, with the usage the stream reported.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator

from gateway.core.record import Outcome, Record
from providers.contract.errors import (
    BadUpstreamResponse,
    GatewayError,
    ProviderError,
    ProviderUnavailable,
    error_event,
)
from providers.contract.log import get_logger
from providers.contract.redact import Redactor, mask_credentials
from providers.contract.stream import (
    UNREADABLE_ANSWER,
    Opened,
    SSEWatch,
    close_quietly,
    read_to_end,
    unreadable,
)
from providers.contract.usage import Price
from providers.wire import sse

DONE_EVENT = sse.encode(sse.DONE)
_USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')


async def relay(opened: Opened, provider: str, record: Record, redactor: Redactor,
                price: Price | None = None, strip_usage: bool = False
                ) -> AsyncGenerator[bytes, None]:
    """Pass the stream through; end it with `[DONE]` or an in-band error, never silently.

    `strip_usage` drops the usage-only event the gateway asked for on the client's behalf.
    The in-band error (in the record's dialect) passes `redactor` (it carries upstream text);
    the upstream's own bytes are relayed as they are."""
    watch = opened.watch
    outcome = Outcome.CLIENT_LEFT
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
        outcome, last = ending(watch, provider, record)
        if last:
            yield (_own_line(sent) if outcome is Outcome.ERROR else b"") + last
    except (ProviderError, *UNREADABLE_ANSWER) as exc:
        outcome = Outcome.ERROR
        if not isinstance(exc, ProviderError):  # a kind could not translate what came
            exc = unreadable(provider, exc)
        event = error_event(_mid_stream(provider, exc), record.dialect)
        yield _own_line(sent) + redactor.encoded(event)
    except Exception:  # a bug: the client still learns the stream did not finish
        outcome = Outcome.ERROR
        get_logger().exception("unhandled_stream_error", provider=provider)
        yield _own_line(sent) + error_event(GatewayError("Internal gateway error"),
                                            record.dialect)
    finally:
        await close_quietly(opened.rest)
        record.events = watch.data_events
        record.end(outcome, watch.usage, price)


class StreamCut(Exception):
    """A byte stream (audio) that broke after its first bytes: it has no in-band error, so the
    connection is cut rather than ended as if the answer were whole."""


async def relay_bytes(opened: Opened, provider: str, record: Record
                      ) -> AsyncGenerator[bytes, None]:
    """Pass an answer that is not an event stream (`Opened.media_type`: audio) through as it
    comes; one that breaks is cut (`StreamCut`), never ended as if it were whole."""
    outcome = Outcome.CLIENT_LEFT
    try:
        yield opened.head
        async for chunk in opened.rest:
            yield chunk
        outcome = Outcome.COMPLETED
    except ProviderError as exc:
        outcome = Outcome.ERROR
        get_logger().warning("byte_stream_cut", provider=provider, reason=exc.reason)
        raise StreamCut(exc.reason) from None
    finally:
        await close_quietly(opened.rest)
        record.end(outcome)


def _own_line(sent: bytes) -> bytes:
    """What starts the gateway's own event on a line of its own, after what was relayed last
    (half an upstream line the gateway could not yet judge, when the upstream lied)."""
    return b"" if not sent or sent.endswith(b"\n\n") else b"\n\n"


def _passed(chunk: bytes, watch: SSEWatch, strip_usage: bool, redactor: Redactor) -> bytes:
    """An upstream chunk as the client gets it, once the watch has read it; never what the
    client could not parse."""
    watch.feed(chunk)
    if watch.malformed:
        raise BadUpstreamResponse("stream event is not a JSON answer chunk (or not UTF-8)")
    if watch.error_event is not None:  # the upstream's own error event: it may quote the
        chunk = redactor.encoded(mask_credentials(chunk.decode("utf-8", "replace")).encode())
    if strip_usage and chunk.find(b'"usage"') >= 0:
        chunk = drop_usage_events(chunk)
    return chunk


def ending(watch: SSEWatch, provider: str, record: Record) -> tuple[Outcome, bytes]:
    """How a stream whose upstream body is over ended, and the last bytes the client gets:
    `[DONE]` when the upstream finished but did not say so, an in-band error when it had not
    finished."""
    watch.end()
    if watch.done:
        return Outcome.COMPLETED, b""
    if watch.finished and not watch.garbage:
        return Outcome.COMPLETED, DONE_EVENT
    return Outcome.ERROR, error_event(
        _mid_stream(provider, ProviderUnavailable("stream ended before it finished")),
        record.dialect)


def drop_usage_events(chunk: bytes) -> bytes:
    """Remove whole `data:` events that carry only usage (`"choices": []`) from a chunk."""
    return sse.drop_events(chunk, lambda data: data.find(b'"usage"') >= 0
                           and _USAGE_ONLY.search(data) is not None)


def _mid_stream(provider: str, exc: ProviderError) -> GatewayError:
    error = ProviderUnavailable(f"provider '{provider}' failed mid-stream: {exc.reason}: "
                                f"{exc.message}")
    error.upstream_status = exc.upstream_status
    return error
