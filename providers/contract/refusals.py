"""Which upstream 4xx answers are a limit of the model rather than a bad request.

A prompt too long for one model's window fits another's; a request one model's content policy
refuses, another may answer. Both are classified here from the upstream's own status, code and
words, so the router can move on where a plain 400 would go back to the client. The wordings
are the engines' own (each has a test with its real message):

- OpenAI: code `context_length_exceeded`, "This model's maximum context length is …"
- Anthropic: "prompt is too long: N tokens > M maximum", "input length and `max_tokens`
  exceed context limit: …"
- Gemini: "The input token count (N) exceeds the maximum number of tokens allowed (M)."
- vLLM: "This model's maximum context length is N tokens. However, you requested …",
  "… is longer than the model's context length …"
- SGLang: "Requested token count exceeds the model's maximum context length of N tokens. …",
  "The input (N tokens) is longer than the model's context length (M tokens)."
- llama.cpp: type `exceed_context_size_error`, "the request exceeds the available context
  size, try increasing it"
- Ollama: "the input length exceeds the context length"
- Bedrock: a `ValidationException` "Input is too long for requested model." (Anthropic's
  models there: Anthropic's own words)

Content policies: OpenAI's code `content_policy_violation`, Azure OpenAI's `content_filter`
("… triggering Azure OpenAI's content management policy …").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import msgspec

_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error",
                             "model_context_window_exceeded"})
_OVERFLOW_WORDS = (
    "maximum context length",
    "longer than the model's context length",
    "prompt is too long",
    "exceed context limit",
    "exceeds the maximum number of tokens allowed",
    "exceeds the available context size",
    "input length exceeds the context length",
    "input is too long for requested model",  # Bedrock's own words
)
_POLICY_CODES = frozenset({"content_policy_violation", "content_filter"})
_POLICY_WORDS = ("content management policy", "content policy")


class Limit(enum.Enum):
    """Why a model could not take a request that another may."""

    CONTEXT = "context_length_exceeded"
    POLICY = "content_policy"


def classify(status: int, message: str, error_type: str | None, code: str | None
             ) -> Limit | None:
    """The model limit an upstream's 4xx reports, or None for a bad request as such."""
    if status not in (400, 413, 422):
        return None
    marks = {(error_type or "").lower(), (code or "").lower()}
    words = message.lower()
    if marks & _OVERFLOW_CODES or any(w in words for w in _OVERFLOW_WORDS):
        return Limit.CONTEXT
    if marks & _POLICY_CODES or any(w in words for w in _POLICY_WORDS):
        return Limit.POLICY
    return None


class _Message(msgspec.Struct):
    """What a message (or a stream's delta) writes: any of these, and it has begun."""

    content: Any = None
    tool_calls: Any = None
    function_call: Any = None
    refusal: Any = None  # the model's own refusal, in its words: an answer
    audio: Any = None
    reasoning_content: Any = None
    reasoning: Any = None

    def wrote(self) -> bool:
        return bool(self.content or self.tool_calls or self.function_call or self.refusal
                    or self.audio or self.reasoning_content or self.reasoning)


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    message: _Message | None = None
    delta: _Message | None = None


class _Answer(msgspec.Struct):
    choices: list[_Choice] | None = None


_ANSWER = msgspec.json.Decoder(_Answer)


def filtered(payloads: Iterable[bytes]) -> bool:
    """Whether a chat answer (a whole body, or a stream's first events) was stopped by a
    content filter before any of it was written: `finish_reason: content_filter` with no
    content, tool call, refusal, audio or reasoning before it. A partly written answer is an
    answer."""
    for payload in payloads:
        if (settled := filtered_first(payload)) is not None:
            return settled
    return False


def filtered_first(payload: bytes) -> bool | None:
    """What one chat answer event says of `filtered`: True (the filter stopped it before
    any content), False (something was written, or it is no answer), None (not yet: an event
    that writes nothing, such as a role, Azure's prompt filter results or usage)."""
    try:
        choices = _ANSWER.decode(payload).choices or []
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    for choice in choices:
        said = choice.message or choice.delta
        if said is not None and said.wrote():
            return False
        if choice.finish_reason == "content_filter":
            return True
    return None
