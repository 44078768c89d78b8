"""A model as a guardrail's judge: an alias of the gateway asked whether a request, or an
answer, is safe.

A judge (`Judge` of a policy) is asked with the request's text (on the output side, the
answer's), as screened (placeholders, masks: a judge never sees what another guardrail took
out), as the user turn of a chat request; a reply starting with `unsafe` (Llama Guard's
format: `unsafe\\nS1`) is a violation. Through `moderations`, a `flagged` result is. A judge
slow past its `timeout`, down, or answering what is no verdict fails, and its `on_error` says
whether the request (the answer) is blocked or let through. The question goes through the
gateway's own stack (`Ask`, made by the pipeline, which sits above this folder): routing,
failover, the record and the key's spend as for any call; a judge's own call is marked
(`ASKING`) so no judge judges it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from gateway.core.call import Call
from gateway.core.settings.guardrails import Judge
from gateway.guardrails.policies import Guardrail
from gateway.guardrails.screening import GuardrailViolation, Screening, walk
from providers.contract.log import get_logger

# Asks an alias through the gateway's stack on behalf of `call`: (endpoint, body, call) ->
# (status, answer body).
Ask = Callable[[str, bytes, Call], Awaitable[tuple[int, bytes]]]
ASKING = "guardrails.judge"  # in `Call.state` of a judge's own call
JUDGE = "JUDGE"  # the category a judge's block is named by
JUDGE_ERROR = "JUDGE_ERROR"  # a judge that failed, under `on_error: "allow"`
# A verdict is a word and a category list: the judge's answer is bounded to that.
VERDICT_TOKENS = 16
# The fields of a request body that carry what its user asks, in every dialect.
_ASKED = ("system", "instructions", "messages", "prompt", "input", "query", "documents")
# ... and those of an answer that carry what the model wrote (chat and completions' choices,
# Responses' output, Anthropic's content), not the request a Responses answer repeats.
ANSWERED = ("choices", "output", "content")


class JudgeFailed(Exception):
    """A judge's answer is no verdict."""


def text_of(body: Any, fields: Sequence[str] = _ASKED) -> str:
    """Every text a request body asks with (an answer's `fields`: `ANSWERED`), one per
    line."""
    parts: list[str] = []

    def keep(text: str, _: str | None) -> str:
        parts.append(text)
        return text

    if isinstance(body, dict):
        for name in fields:
            if name in body:
                walk(body[name], keep, name)
    return "\n".join(parts)


def question(judge: Judge, text: str) -> tuple[str, bytes]:
    """The endpoint and body that ask `judge` about `text`."""
    if judge.endpoint == "moderations":
        return "moderations", msgspec.json.encode({"model": judge.alias, "input": text})
    return "chat/completions", msgspec.json.encode({
        "model": judge.alias, "messages": [{"role": "user", "content": text}],
        "max_tokens": VERDICT_TOKENS})


def unsafe(judge: Judge, status: int, body: bytes) -> bool:
    """Whether `judge`'s answer finds a violation; `JudgeFailed` when it is no verdict."""
    if status != 200:
        raise JudgeFailed(f"status {status}")
    try:
        answer = msgspec.json.decode(body)
        if judge.endpoint == "moderations":
            return any(bool(result["flagged"]) for result in answer["results"])
        said = answer["choices"][0]["message"]["content"]
    except (msgspec.DecodeError, KeyError, IndexError, TypeError) as exc:
        raise JudgeFailed(f"no verdict: {type(exc).__name__}") from None
    if not isinstance(said, str):
        raise JudgeFailed("no verdict: no text")
    return said.strip().lower().startswith("unsafe")


async def judged(call: Call, text: str, judges: Sequence[Guardrail], screening: Screening,
                 ask: Ask, phase: str = "input") -> None:
    """Every judge of `judges` asked about `text` (`phase`'s) at once; the first that blocks
    raised as a `GuardrailViolation`, the others' verdicts awaited or dropped with it."""
    _first_block(await asyncio.gather(*(_verdict(call, text, g, screening, ask, phase)
                                         for g in judges)))


def unjudged(call: Call, judges: Sequence[Guardrail], screening: Screening, reason: str,
             phase: str = "input") -> None:
    """Judges that could not be asked (`reason`): each one's `on_error` says, the first that
    blocks raised as a `GuardrailViolation`."""
    _first_block([_failed(call, g, screening, reason, phase) for g in judges])


def _first_block(blocks: Sequence[GuardrailViolation | None]) -> None:
    """The first of the judges' blocks raised, if any blocked (each verdict already counted)."""
    for block in blocks:
        if block is not None:
            raise block


async def _verdict(call: Call, text: str, guardrail: Guardrail, screening: Screening,
                   ask: Ask, phase: str) -> GuardrailViolation | None:
    judge = guardrail.judge
    assert judge is not None
    endpoint, body = question(judge, text)
    try:
        async with asyncio.timeout(judge.timeout):
            status, answer = await ask(endpoint, body, call)
        if not unsafe(judge, status, answer):
            return None
    except (TimeoutError, JudgeFailed) as exc:
        return _failed(call, guardrail, screening,
                       "timeout" if isinstance(exc, TimeoutError) else str(exc), phase)
    screening.took(guardrail, JUDGE, 1)
    return GuardrailViolation.of(guardrail.name, JUDGE, phase)


def _failed(call: Call, guardrail: Guardrail, screening: Screening, reason: str,
            phase: str) -> GuardrailViolation | None:
    """A judge that gave no verdict: logged, and a block unless its `on_error` allows."""
    judge = guardrail.judge
    assert judge is not None
    get_logger().warning("guardrail_judge_failed", guardrail=guardrail.name, alias=judge.alias,
                         reason=reason, phase=phase, request_id=call.record.request_id)
    if judge.on_error == "allow":
        screening.took(guardrail, JUDGE_ERROR, 1, "allow")
        return None
    screening.took(guardrail, JUDGE, 1)
    return GuardrailViolation.of(guardrail.name, JUDGE, phase)
