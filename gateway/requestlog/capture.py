"""The `capture` stage: what the request log keeps of a request's bodies, bounded in bytes.

Built only when llms.json has a `logs` section (`gateway.pipeline.stack`). Per request it
decides what is kept: the key's own `logs.capture` (a virtual key's, `/admin/keys`), else its
alias's (`models.<alias>.logs.capture`), else `logs.capture`. With "bodies" it keeps the first
bytes of the request body and of the answer: a whole answer's bytes, or the text a stream's
events carry, assembled as they pass (never more than the bound is held, however long the
stream). A `private` key's bodies are never kept. Nothing is redacted or decoded here: the
request log's writer does that off the request path (`journal.rendered`), with a margin read
past the cut so a secret is never cut in two before it is found.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import msgspec

from gateway.accounts.account import Account
from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.delivery import Streamed, Whole
from gateway.core.endpoints import UPLOADS
from gateway.core.settings import Snapshot
from providers.contract.stream import close_quietly
from providers.wire import sse

# The payload a request's row says it has (`/admin/logs/{request_id}`).
DISABLED = "disabled"  # capture is "metadata" for it
NOT_CAPTURED = "not_captured"  # capture is "bodies", but nothing was kept (a `private` key)
STORED = "stored"
# Bytes read past the cut, so that a secret straddling it is still found and removed.
SECRET_MARGIN = 4096


@dataclass(slots=True)
class Bodies:
    """What is kept of one request's bodies: at most `most` bytes of each."""

    most: int
    request: bytes = b""
    uploaded: int = 0  # a multipart upload's size: its bytes are not kept
    answer: bytes = b""  # a whole answer's first bytes, or a stream's when it had no text
    media_type: str | None = None
    text: list[str] | None = None  # a stream's text, as its events carried it
    size: int = 0  # characters held in `text`
    events: sse.Reader | None = field(default=None, repr=False)

    @property
    def held(self) -> int:
        """About the bytes this capture holds, request and answer."""
        return len(self.request) + len(self.answer) + self.size


class _Delta(msgspec.Struct):
    content: str | None = None  # Chat Completions
    text: str | None = None  # Anthropic's `text_delta`


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None  # legacy Completions


class _Event(msgspec.Struct):
    type: str | None = None
    choices: list[_Choice] | None = None
    delta: _Delta | str | None = None  # Anthropic's content deltas; Responses' deltas


_EVENT = msgspec.json.Decoder(_Event)


def event_text(data: bytes) -> str:
    """The answer text one stream event carries, in any of the dialects the gateway relays;
    "" for an event that carries none (or is no JSON)."""
    try:
        event = _EVENT.decode(data)
    except msgspec.MsgspecError:
        return ""
    if event.choices:
        return "".join((c.delta.content or "") if c.delta is not None else (c.text or "")
                       for c in event.choices)
    delta = event.delta
    if isinstance(delta, str):  # a Responses event: its text, not its tools' arguments
        return delta if event.type == "response.output_text.delta" else ""
    return (delta.text or "") if delta is not None else ""


def textual(media_type: str) -> bool:
    """Whether an answer of this type is text worth keeping (not audio, not an image)."""
    return media_type.startswith("text/") or "json" in media_type


def capture(snapshot: Snapshot) -> Stage:
    """The stage that decides and keeps what the request log stores of each request's bodies
    (`snapshot.logs` must be set)."""
    assert snapshot.logs is not None
    default, most = snapshot.logs.capture, snapshot.logs.max_body_bytes + SECRET_MARGIN
    by_alias = {alias: policy.capture for alias, policy in snapshot.policies.items()
                if policy.capture is not None}
    private = frozenset(key.limits.key_id for key in snapshot.keys + snapshot.admin_keys
                        if key.private)

    async def stage(call: Call, following: Next) -> Delivery:
        key, record = call.key, call.record
        own = key.capture if isinstance(key, Account) else None
        if (own or by_alias.get(call.alias) or default) != "bodies":
            record.bodies = DISABLED
            return await following(call)
        if key is not None and (key.limits.key_id in private
                                or (isinstance(key, Account) and key.private)):
            record.bodies = NOT_CAPTURED
            return await following(call)
        bodies = Bodies(most)
        if call.endpoint in UPLOADS:
            bodies.uploaded = len(call.raw)
        else:
            bodies.request = call.raw[:most]
        record.bodies = bodies
        return kept(await following(call), bodies)

    return stage


def kept(delivery: Delivery, bodies: Bodies) -> Delivery:
    """`delivery`, its answer kept in `bodies` as it goes: a whole one at once, a stream's text
    as its events pass."""
    if isinstance(delivery, Whole):
        if textual(delivery.media_type):
            bodies.answer, bodies.media_type = delivery.body[:bodies.most], delivery.media_type
        return delivery
    if isinstance(delivery, Streamed) and textual(delivery.media_type):
        bodies.media_type, bodies.text, bodies.events = delivery.media_type, [], sse.Reader()
        return msgspec.structs.replace(delivery, chunks=_streamed(delivery.chunks, bodies))
    return delivery


async def _streamed(chunks: AsyncGenerator[bytes, None], bodies: Bodies
                    ) -> AsyncGenerator[bytes, None]:
    """The stream's chunks as they come, each also read for its text until `bodies` is full;
    closing this closes the stream (which ends its record)."""
    try:
        async for chunk in chunks:
            if bodies.events is not None:
                _read(chunk, bodies)
            yield chunk
    finally:
        bodies.events = None
        await close_quietly(chunks)


def _read(chunk: bytes, bodies: Bodies) -> None:
    """One chunk's text added to `bodies`; once it holds `most` bytes, reading stops (and a
    stream with no text keeps its first bytes as they were)."""
    assert bodies.events is not None and bodies.text is not None
    if not bodies.text and len(bodies.answer) < bodies.most:
        bodies.answer += chunk[:bodies.most - len(bodies.answer)]
    for event in bodies.events.feed(chunk):
        if text := event_text(event.data):
            if not bodies.text:
                bodies.answer = b""  # the text is what is kept
            bodies.text.append(text)
            bodies.size += len(text)
            if bodies.size >= bodies.most:
                bodies.events = None
                return
