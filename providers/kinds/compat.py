"""Translation between what OpenAI clients send and what an OpenAI-compatible upstream accepts.

Pure functions, no I/O. A provider's config says which spellings it understands (its
`OpenAIOptions`); the request is rewritten only when the client used another one, and the answer
is normalised on the way back: `reasoning` and `reasoning_content` both present, and the
deprecated `function_call` shape for clients that asked with `functions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from providers.contract.chat import (
    FunctionCall,
    FunctionDefinition,
    NamedFunction,
    asked_output,
    checked,
)
from providers.wire import sse

ReasoningKnob = Literal["chat_template_kwargs", "enable_thinking", "reasoning_effort"]
MaxTokensField = Literal["max_tokens", "max_completion_tokens"]


class OpenAIOptions(msgspec.Struct, frozen=True):
    """The `openai` kind's own fields in llms.json."""

    max_tokens_field: MaxTokensField | None = None  # None: relay whichever the client sent
    reasoning: ReasoningKnob | None = None  # None: relay the client's switches untouched
    legacy_functions: bool = False  # the upstream still accepts functions/function_call
    responses: bool = False  # the upstream serves /v1/responses itself
    stream_usage: bool = True  # ask streams for usage (cost, token limits)
    # The upstream continues a trailing assistant message when told (vLLM, SGLang): how a
    # broken stream is resumed there (`Provider.continues`).
    continue_final_message: bool = False
    # "native": the upstream serves /v1/files and /v1/batches, and batches go there.
    batches: Literal["native"] | None = None


OPTION_FIELDS = frozenset(OpenAIOptions.__struct_fields__)


def read_options(raw: Mapping[str, Any]) -> OpenAIOptions:
    """The options from a provider's config entry; ValueError names the bad field."""
    try:
        return msgspec.convert({k: v for k, v in raw.items() if k in OPTION_FIELDS},
                               OpenAIOptions)
    except msgspec.ValidationError as exc:
        problem, _, at = str(exc).partition(" - at `$.")
        raise ValueError(f"{at.rstrip('`')}: {problem}" if at else problem) from None


_REASONING_KEYS = (b'"chat_template_kwargs"', b'"enable_thinking"', b'"reasoning_effort"')


def needs_translation(raw: bytes, options: OpenAIOptions) -> bool:
    """A cheap look at the bytes: might this body need rewriting for this provider?"""
    # `find`, not `in`, on every request's bytes: `in` first tries its operand as an int,
    # and makes and drops a TypeError each time.
    if not options.legacy_functions and (raw.find(b'"functions"') >= 0
                                         or raw.find(b'"function_call"') >= 0):
        return True
    if options.max_tokens_field is not None and raw.find(b'"max_') >= 0:
        return True
    return options.reasoning is not None and any(raw.find(k) >= 0 for k in _REASONING_KEYS)


class _LegacyMessage(msgspec.Struct):
    function_call: FunctionCall | None = None
    name: str | None = None


class Rewritten(msgspec.Struct):
    """The fields `translate_request` reads, typed: the rest of the body is relayed as sent."""

    messages: list[_LegacyMessage] | None = None
    functions: list[FunctionDefinition] | None = None
    function_call: str | NamedFunction | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def translate_request(body: dict[str, Any], options: OpenAIOptions) -> dict[str, Any]:
    """Rewrite `body` (a copy the caller owns) into the spellings this provider knows;
    InvalidRequest names a field of the wrong type."""
    checked(body, Rewritten)
    if options.max_tokens_field is not None:
        _rename_max_tokens(body, options.max_tokens_field)
    if options.reasoning is not None:
        _translate_reasoning(body, options.reasoning)
    if not options.legacy_functions:
        _functions_to_tools(body)
    return body


def _rename_max_tokens(body: dict[str, Any], field: MaxTokensField) -> None:
    """One field sent, at the largest any spelling asked (what a budget's hold assumed)."""
    other = "max_completion_tokens" if field == "max_tokens" else "max_tokens"
    if other in body:
        largest = asked_output(body)
        body.pop(other)
        if largest is not None:
            body[field] = largest


def thinking_wanted(body: Mapping[str, Any]) -> tuple[bool | None, str | None]:
    """The client's reasoning switch, however it spelled it: (on/off or None, effort or None)."""
    kwargs = body.get("chat_template_kwargs") or {}
    thinking: bool | None = None
    for value in (kwargs.get("thinking"), kwargs.get("enable_thinking"),
                  body.get("enable_thinking")):
        if isinstance(value, bool):
            thinking = value
    effort = body.get("reasoning_effort")
    effort = effort if isinstance(effort, str) else None
    if effort == "none":
        thinking, effort = False, None
    elif effort is not None and thinking is None:
        thinking = True
    return thinking, effort


def _translate_reasoning(body: dict[str, Any], knob: ReasoningKnob) -> None:
    thinking, effort = thinking_wanted(body)
    if thinking is None:
        return
    kwargs = dict(body.get("chat_template_kwargs") or {})
    kwargs.pop("thinking", None)
    kwargs.pop("enable_thinking", None)
    body.pop("enable_thinking", None)
    body.pop("reasoning_effort", None)
    if knob == "chat_template_kwargs":
        kwargs["thinking"] = thinking
    elif knob == "enable_thinking":
        body["enable_thinking"] = thinking
    else:  # reasoning_effort: "off" is the cheapest effort every such API accepts
        body["reasoning_effort"] = effort or ("medium" if thinking else "low")
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    else:
        body.pop("chat_template_kwargs", None)


def _functions_to_tools(body: dict[str, Any]) -> None:
    functions = body.pop("functions", None)
    call = body.pop("function_call", None)
    if functions:
        body.setdefault("tools", [{"type": "function", "function": f} for f in functions])
    if call is not None:
        if isinstance(call, dict) and "name" in call:
            choice: Any = {"type": "function", "function": {"name": call["name"]}}
        else:
            choice = call  # "auto" / "none" mean the same for tool_choice
        body.setdefault("tool_choice", choice)
    for message in body.get("messages") or ():
        _legacy_message_to_tools(message)


def _legacy_message_to_tools(message: dict[str, Any]) -> None:
    # History in the old shape: an assistant `function_call` and a `function` role answer.
    if isinstance(message, dict) and message.get("function_call") and not message.get(
            "tool_calls"):
        call = message.pop("function_call")
        message["tool_calls"] = [{"id": _call_id(call.get("name", "")), "type": "function",
                                  "function": call}]
    if isinstance(message, dict) and message.get("role") == "function":
        message["role"] = "tool"
        message["tool_call_id"] = _call_id(message.pop("name", ""))


def _call_id(name: str) -> str:
    # The legacy API has no call ids; a stable one per function name pairs call and answer.
    return f"call_{name}"


def used_legacy_functions(body: Mapping[str, Any]) -> bool:
    """The client asked in the deprecated shape, so it expects `function_call` back."""
    return "functions" in body or "function_call" in body


def normalize_message(message: dict[str, Any], legacy: bool) -> bool:
    """Both reasoning keys, and `function_call` for legacy clients; True if changed."""
    changed = False
    if "reasoning_content" in message and "reasoning" not in message:
        message["reasoning"] = message["reasoning_content"]
        changed = True
    elif "reasoning" in message and "reasoning_content" not in message:
        message["reasoning_content"] = message["reasoning"]
        changed = True
    if legacy and message.get("tool_calls"):
        message["function_call"] = message.pop("tool_calls")[0]["function"]
        changed = True
    return changed


def normalize_reply(body: bytes, legacy: bool) -> bytes:
    """A complete chat answer with reasoning under both names and legacy calls translated."""
    if body.find(b'"reasoning') < 0 and not (legacy and body.find(b'"tool_calls"') >= 0):
        return body
    answer = msgspec.json.decode(body)
    changed = False
    for choice in answer.get("choices") or ():
        message = choice.get("message")
        if isinstance(message, dict) and normalize_message(message, legacy):
            changed = True
        if legacy and choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "function_call"
    return msgspec.json.encode(answer) if changed else body


def _needs_change(events: bytes) -> bool:
    """Whether `events` may hold a field `StreamNormalizer` changes (a reasoning field, tool
    calls, a `tool_calls` finish): two substring searches, far cheaper than a pattern's
    alternatives tried at every quote of a chunk (`find`, not `in`: see `sse.Reader.data`)."""
    return events.find(b'"reasoning') >= 0 or events.find(b'"tool_calls"') >= 0


class StreamNormalizer:
    """The streaming twin of `normalize_reply`, event by event; holds back partial events.
    Events that need no change pass through as the bytes they came in."""

    def __init__(self, legacy: bool) -> None:
        self.legacy = legacy
        self._framer = sse.Framer()

    def feed(self, chunk: bytes) -> bytes:
        """Normalised complete events from this chunk (plus any held from the last one)."""
        complete = self._framer.feed(chunk)
        if not complete or not _needs_change(complete):
            return complete
        return b"".join(self._event(e) for e in sse.split(complete))

    def close(self) -> bytes:
        """Whatever is held when the stream ends."""
        return self._framer.flush()

    def _event(self, raw: bytes) -> bytes:
        if not _needs_change(raw) or (event := sse.parse(raw)) is None:
            return raw
        try:
            chunk = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            return raw
        if not isinstance(chunk, dict):
            return raw
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict):
                normalize_message(delta, self.legacy)
            if self.legacy and choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "function_call"
        return sse.encode(msgspec.json.encode(chunk), event.name)
