"""Output judges: an answer held until the judges of its guardrails have read it.

A whole answer is judged as it is; a stream is held by the gateway until it ends (at most
`Guardrails.answer_bound` bytes: past them, the judges' `on_error` decides, and an answer let
through goes on unjudged), then judged, then relayed as the same events, or replaced by the
error (raised as a `GuardrailViolation` for the stage to write as its error event). A judge
reads the answer's text as the other guardrails left it: the provider's placeholders, the
output side's masks, never a value given back. An answer another output guardrail blocks is
not judged: the stage blocks it anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Hashable, Sequence
from typing import Any

import msgspec

from gateway.core.call import Call
from gateway.guardrails.judges import ANSWERED, Ask, judged, text_of, unjudged
from gateway.guardrails.policies import Guardrail
from gateway.guardrails.screening import GuardrailViolation, Screening, walk
from gateway.guardrails.streams import StreamScreen, answer_deltas
from providers.contract.stream import SSEWatch, close_quietly
from providers.wire import sse

OUTPUT = "output"
# A held stream longer than this has its text read in a worker thread.
OFF_LOOP_BYTES = 64 * 1024


async def whole_judged(call: Call, body: bytes, judges: Sequence[Guardrail],
                       screening: Screening, output: Sequence[Guardrail], ask: Ask) -> None:
    """A whole answer's `body` (JSON) judged: a `GuardrailViolation` when a judge blocks."""
    try:
        answer = msgspec.json.decode(body)
    except msgspec.DecodeError:
        answer = None
    if output:
        scratch = Screening()  # its counts are the stage's to take, once
        try:
            answer = walk(answer, lambda text, _: scratch.screened(text, output, OUTPUT))
        except GuardrailViolation:
            return
    if text := text_of(answer, ANSWERED):
        await judged(call, text, judges, screening, ask, OUTPUT)


async def held(chunks: AsyncGenerator[bytes, None], call: Call, judges: Sequence[Guardrail],
               screening: Screening, output: Sequence[Guardrail], ask: Ask, most: int
               ) -> AsyncGenerator[bytes, None]:
    """`chunks` (a stream of server-sent events) once they are all in and judged; a
    `GuardrailViolation` instead when a judge blocks, nothing of the stream written."""
    parts: list[bytes] = []
    size = 0
    # Pulled no further once the stream says it is done: the generators below end the call's
    # record when they are over, and a block must end it as the block (`Record.overruled`).
    watch = SSEWatch()
    try:
        try:
            async for chunk in chunks:
                parts.append(chunk)
                size += len(chunk)
                if size > most:
                    unjudged(call, judges, screening, f"answer over {most} bytes", OUTPUT)
                    break
                watch.feed(chunk)
                if watch.done:
                    break
            if size <= most and (text := await _text_of_stream(b"".join(parts), output)):
                await judged(call, text, judges, screening, ask, OUTPUT)
        except GuardrailViolation as exc:  # the request ends as the block, not as the close
            call.record.overruled(exc.status, exc.code)
            raise
        for part in parts:
            yield part
        parts.clear()
        async for chunk in chunks:  # the stream's end, or past the bound, let through
            yield chunk
    finally:
        await close_quietly(chunks)


async def _text_of_stream(raw: bytes, output: Sequence[Guardrail]) -> str:
    """`stream_text`, off the event loop for a long stream (a few microseconds an event)."""
    if len(raw) <= OFF_LOOP_BYTES:
        return stream_text(raw, output)
    return await asyncio.to_thread(stream_text, raw, output)


def stream_text(raw: bytes, output: Sequence[Guardrail] = ()) -> str:
    """The texts a stream's events write (each channel's deltas joined, one channel per
    line), masked by the `output` guardrails; empty when one of them blocks."""
    if output:
        screen = StreamScreen(Screening(), output)
        try:
            raw = screen.feed(raw) + screen.end()
        except GuardrailViolation:
            return ""
    channels: dict[Hashable, list[str]] = {}
    reader = sse.Reader(max_line=len(raw) + 1)
    for event in reader.feed(raw) + reader.flush():
        if event.done:
            continue
        try:
            payload: Any = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            continue
        if isinstance(payload, dict):
            for key, holder, field, _, _ in answer_deltas(payload)[0]:
                channels.setdefault(key, []).append(holder[field])
    return "\n".join("".join(texts) for texts in channels.values())
