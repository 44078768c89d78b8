"""The guardrails' stage: a request's text screened before anything keeps or sends it, its
answer screened and its placeholders given back on the way out.

It sits right after admission (it needs the alias, and the key's and team's guardrails) and
before the budget, the queue's turn, idempotency and the cache: what those keep, and what the
providers and traces see, is the request as screened (placeholders, masks), and the answer as
the provider wrote it (placeholders). The values come back only in what this stage hands the
edge. A batch line (run by the gateway itself, `Call.caller`) is answered with placeholders:
its output file is kept by the gateway. Output judges read the answer before any of it leaves
(`gateway.guardrails.verdicts`: a stream is held whole for them).

Built only when llms.json has a guardrail: keys and teams can only name the file's. A request
whose guardrails look for names and places is screened in the named-entity model's worker
thread (`gateway.guardrails.entities`), the event loop free meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec

from gateway.core.call import Call, Delivery, Next, Stage
from gateway.core.delivery import Streamed, Whole, error_delivery
from gateway.core.record import Record
from gateway.guardrails.entities import EntitiesUnread, Models
from gateway.guardrails.judges import ASKING, Ask, judged, text_of
from gateway.guardrails.policies import Guardrail, Guardrails
from gateway.guardrails.screening import GuardrailViolation, Screening, text_size
from gateway.guardrails.streams import StreamScreen
from gateway.guardrails.tally import Tally
from gateway.guardrails.verdicts import held, whole_judged
from gateway.observe.metrics import Metrics
from providers.contract.errors import error_event
from providers.contract.log import get_logger
from providers.contract.redact import Redactor
from providers.contract.stream import close_quietly

HEADER = "x-llms-guardrails"
# The endpoints whose bodies carry text a guardrail reads, and whose answers are text; speech
# and images are left out (a placeholder spoken or drawn cannot be given back).
GUARDED = frozenset(("chat/completions", "completions", "responses", "embeddings", "messages",
                     "messages/count_tokens", "moderations", "rerank"))


# ... and those whose answers are text to screen and give values back in.
ANSWERS_TEXT = GUARDED - {"embeddings", "messages/count_tokens"}


def guarded(endpoint: str) -> bool:
    """Whether a call to `endpoint` can meet a guardrail."""
    return endpoint in GUARDED


def guardrails(policies: Guardrails, metrics: Metrics, tally: Tally, redactor: Redactor,
               ask: Ask) -> Stage:
    """The stage that screens a call and its answer by the guardrails in force for it, and
    asks their judges (through `ask`) whether it may pass."""
    outlet = _Outlet(policies, metrics, tally, redactor, ask)

    async def stage(call: Call, following: Next) -> Delivery:
        in_force = policies.in_force(call.alias, _named(call.key))
        if not in_force or call.outgoing is None or call.outgoing.content_type is not None:
            return await following(call)
        screening = Screening()
        input_side = [g for g in in_force if g.on_input]
        try:
            if any(g.entities is not None for g in input_side):
                await _screen_off_loop(call, screening, input_side, policies.models)
            else:
                _screen_request(call, screening, input_side)
        except GuardrailViolation:  # told, and named on its answer
            call.record.mark(HEADER, screening.header())
            _publish(screening, call.record, metrics, tally)
            raise
        if screening.taken:
            call.record.mark(HEADER, screening.header())
            _told(call.record, screening)
        judging = not call.state.get(ASKING)  # a judge's own call is never judged
        judges = tuple(g for g in in_force if g.judge is not None and g.on_input and judging)
        if judges:
            following = functools.partial(_judged_first, judges=judges, screening=screening,
                                          ask=ask, following=following)
        if call.endpoint not in ANSWERS_TEXT:
            try:
                return await following(call)
            finally:
                _publish(screening, call.record, metrics, tally)
        try:
            delivery = await following(call)
        except GuardrailViolation:  # a judge's
            _publish(screening, call.record, metrics, tally)
            raise
        return await _answered(call, delivery, in_force, screening, judging, outlet)

    return stage


@dataclasses.dataclass(frozen=True, slots=True)
class _Outlet:
    """What the stage's output side needs of its snapshot and process."""

    policies: Guardrails
    metrics: Metrics
    tally: Tally
    redactor: Redactor
    ask: Ask


async def _answered(call: Call, delivery: Delivery, in_force: Sequence[Guardrail],
                    screening: Screening, judging: bool, out: _Outlet) -> Delivery:
    """The answer as the client gets it: judged by the output judges (a stream held whole
    for them), screened by the output guardrails, its values given back."""
    # On the output side, pseudonymizing is giving the request's values back.
    output = [g for g in in_force
              if g.on_output and g.action != "pseudonymize" and g.judge is None]
    restores = bool(screening.originals) and not call.caller and any(
        g.on_output and g.action == "pseudonymize" for g in in_force)
    judges = tuple(g for g in in_force if g.judge is not None and g.on_output and judging)
    if not output and not restores and not judges:
        _publish(screening, call.record, out.metrics, out.tally)
        return delivery
    kept = screening if restores else _Kept(screening)
    if isinstance(delivery, Streamed) and delivery.media_type == "text/event-stream":
        chunks = delivery.chunks
        if judges and delivery.status == 200:
            chunks = held(chunks, call, judges, screening, output, out.ask,
                          out.policies.answer_bound(call.alias))
        screen = StreamScreen(kept, output) if output or restores else None
        return msgspec.structs.replace(delivery, chunks=_screened(
            chunks, screen, screening, delivery.record, out.metrics, out.tally))
    if isinstance(delivery, Whole):
        if judges and _judgeable(delivery):
            try:
                await whole_judged(call, delivery.body, judges, screening, output, out.ask)
            except GuardrailViolation as exc:
                call.record.mark(HEADER, screening.header())
                _publish(screening, call.record, out.metrics, out.tally)
                return error_delivery(exc, delivery.record, out.redactor)
        if output or restores:
            delivery = _whole(delivery, kept, output, out.redactor)
        elif screening.taken:
            _told(delivery.record, screening)
            delivery = msgspec.structs.replace(delivery, headers={
                **delivery.headers, HEADER: screening.header()})
    _publish(screening, call.record, out.metrics, out.tally)
    return delivery


async def _judged_first(call: Call, judges: Sequence[Guardrail], screening: Screening,
                        ask: Ask, following: Next) -> Delivery:
    """`following`'s answer once the judges passed the request (as screened: no judge sees
    what another guardrail took out). Those asked first run before it goes on; those asked
    beside it (`parallel`) run while it does, and its answer is held until they pass and
    dropped (its stream closed) when one blocks."""
    assert call.outgoing is not None
    text = text_of(call.outgoing.json())
    first = [g for g in judges if g.judge is not None and not g.judge.parallel]
    beside = [g for g in judges if g.judge is not None and g.judge.parallel]
    taken = len(screening.taken)
    running = asyncio.ensure_future(judged(call, text, beside, screening, ask)) \
        if beside else None
    delivery: Delivery = None
    try:
        if first:
            await judged(call, text, first, screening, ask)
        delivery = await following(call)
        if running is not None:
            await running
    except BaseException as exc:
        if running is not None and not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        if isinstance(exc, GuardrailViolation):
            call.record.mark(HEADER, screening.header())
        await _dropped(delivery, exc)
        raise
    if len(screening.taken) != taken and delivery is not None:  # a judge's error let through
        call.record.mark(HEADER, screening.header())
        delivery = msgspec.structs.replace(delivery, headers={**delivery.headers,
                                                          HEADER: screening.header()})
    return delivery


async def _dropped(delivery: Delivery, exc: BaseException) -> None:
    """An answer thrown away (a judge's block, the call cancelled while a judge ran): its
    stream closed, its request ended as the block."""
    if delivery is None:
        return
    if isinstance(exc, GuardrailViolation):
        delivery.record.overruled(exc.status, exc.code)
    if isinstance(delivery, Streamed):
        await close_quietly(delivery.chunks)


def _named(key: object) -> Sequence[str]:
    """The guardrails a virtual key and its team name (`Account.guardrails`)."""
    return getattr(key, "guardrails", ())


def _screen_request(call: Call, screening: Screening, input_side: list[Guardrail]) -> None:
    """The request's body screened; when anything changed, what the rest of the stack sends
    and keeps is the screened body."""
    if input_side and call.outgoing is not None:
        body = call.outgoing.json()
        _sends(call, body, screening.request(body, input_side))


async def _screen_off_loop(call: Call, screening: Screening, input_side: list[Guardrail],
                           models: Models) -> None:
    """`_screen_request` with names and places looked for, in the model's worker thread, on
    a screening of the worker's own (one whose look timed out may still be running): handed
    to `screening` once it is over. A text the model did not read is refused."""
    assert call.outgoing is not None
    body = call.outgoing.json()
    worker = Screening(off_loop=True)
    reading = [g for g in input_side if g.entities is not None]
    try:
        screened = await models.off_loop(lambda: worker.request(body, input_side),
                                         [g.entities for g in reading if g.entities],
                                         text_size(body))
    except EntitiesUnread as exc:
        get_logger().warning("guardrail_ner_unread", guardrail=reading[0].name, reason=str(exc),
                             request_id=call.record.request_id)
        screening.took(reading[0], "NER", 1, "block")
        raise GuardrailViolation(f"Blocked by guardrail '{reading[0].name}': the request was "
                                 f"{exc}", guardrail=reading[0].name, category="NER") from None
    except GuardrailViolation:
        screening.adopt(worker)
        raise
    screening.adopt(worker)
    _sends(call, body, screened)


def _sends(call: Call, body: Any, screened: Any) -> None:
    """`screened` what the rest of the stack sends and keeps, when it differs from `body`."""
    if screened is not body and call.outgoing is not None:
        raw = msgspec.json.encode(screened)
        call.raw = raw
        call.outgoing = dataclasses.replace(call.outgoing, raw=raw, _json=screened)


class _Kept(Screening):
    """A screening whose placeholders stay as they are in the answer (a batch line's)."""

    __slots__ = ()

    def __init__(self, screening: Screening) -> None:
        super().__init__()
        self.taken = screening.taken

    def restored(self, text: str, as_json: bool = False) -> str:
        return text


def _judgeable(delivery: Whole) -> bool:
    """Whether a whole answer is one the output side reads: a success, in JSON."""
    return delivery.status == 200 and "json" in delivery.media_type


def _whole(delivery: Whole, screening: Screening, output: list[Guardrail],
           redactor: Redactor) -> Whole:
    """A whole answer screened and given back its values; a block is the error instead."""
    if not _judgeable(delivery):
        return delivery
    try:
        body = msgspec.json.decode(delivery.body)
    except msgspec.DecodeError:
        return delivery
    try:
        screened: Any = screening.answer(body, output)
    except GuardrailViolation as exc:
        return error_delivery(exc, delivery.record, redactor)
    headers = {**delivery.headers, HEADER: screening.header()} if screening.taken \
        else delivery.headers
    if screening.taken:
        _told(delivery.record, screening)
    if screened is body:
        return msgspec.structs.replace(delivery, headers=headers)
    return msgspec.structs.replace(delivery, body=msgspec.json.encode(screened), headers=headers)


async def _screened(chunks: AsyncGenerator[bytes, None], screen: StreamScreen | None,
                    screening: Screening, record: Record, metrics: Metrics, tally: Tally
                    ) -> AsyncGenerator[bytes, None]:
    """The stream as the client gets it (screened by `screen`, when there is one); a block
    (the screen's, or an output judge's raised by `chunks`) ends it with an in-band error
    event, the matched text never written."""
    taken = len(screening.taken)
    try:
        async for chunk in chunks:
            if written := screen.feed(chunk) if screen is not None else chunk:
                yield written
            if len(screening.taken) != taken:  # before the stream's record ends
                taken = len(screening.taken)
                _told(record, screening)
        if screen is not None and (rest := screen.end()):
            yield rest
    except GuardrailViolation as exc:
        record.overruled(exc.status, exc.code)  # ends as the block, not as the close
        _told(record, screening)
        await close_quietly(chunks)
        yield error_event(exc, record.dialect)
    finally:
        await close_quietly(chunks)
        _publish(screening, record, metrics, tally)


def _publish(screening: Screening, record: Record, metrics: Metrics, tally: Tally) -> None:
    """The actions taken, told once: Prometheus, the status page's counts, the log line."""
    if not screening.taken:
        return
    _told(record, screening)
    for (guardrail, category, action), count in screening.taken.items():
        metrics.guardrail(guardrail, category, action, count)
        tally.add(guardrail, category, action, count)
    screening.taken = {}


def _told(record: Record, screening: Screening) -> None:
    """The actions taken so far on the record, for the log line and the request log's row (a
    stream's record may end before the stream's last chunk is screened: told as they come)."""
    record.guardrails = screening.actions()
    record.detail["guardrails"] = ", ".join(record.guardrails)
