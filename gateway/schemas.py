"""The few request fields the gateway reads, typed; everything else passes through untouched."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec

from providers.contract.errors import InvalidRequest

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class Message(msgspec.Struct):
    """A chat message; only its role is checked here, the provider checks the rest."""

    role: NonEmptyStr
    content: Any = None


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


Stop = str | Annotated[list[str], msgspec.Meta(max_length=4)] | None
Choices = Annotated[int, msgspec.Meta(ge=1, le=128)] | None


class ChatHead(msgspec.Struct):
    """What routing needs from a chat-completions body, and the bounds the gateway enforces."""

    model: NonEmptyStr
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    n: Choices = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None


# msgspec allows one array-like per union: the element union covers strings, token ids and
# lists of token ids; a mixed list is left for the provider to refuse.
Prompt = str | list[str | int | list[int]]


class CompletionHead(msgspec.Struct):
    """What routing needs from a legacy completions body."""

    model: NonEmptyStr
    prompt: Prompt
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: Stop = None
    n: Choices = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None


class ResponsesHead(msgspec.Struct):
    """What routing needs from a Responses API body."""

    model: NonEmptyStr
    input: str | list[dict[str, Any]] | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = True


Head = TypeVar("Head", bound=msgspec.Struct)

_FIELD = re.compile(r"`\$\.(\w+)|required field `(\w+)`")


def merge_extra_body(raw: bytes) -> bytes:
    """A literal `extra_body` object is merged into the top level, as the OpenAI SDK does."""
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return raw  # `parse` reports it
    extra = body.pop("extra_body", None) if isinstance(body, dict) else None
    if not isinstance(extra, dict):
        return raw
    body.update(extra)
    return msgspec.json.encode(body)


def parse(raw: bytes, head: type[Head]) -> tuple[Head, bytes]:
    """Decode and check `raw` as `head`, returning the body to forward (extra_body merged);
    InvalidRequest names the field that is wrong."""
    if not raw.strip():
        raise InvalidRequest("Request body is empty; expected a JSON object")
    if b'"extra_body"' in raw:
        raw = merge_extra_body(raw)
    try:
        return msgspec.json.decode(raw, type=head), raw
    except msgspec.ValidationError as exc:
        message = str(exc)
        found = _FIELD.search(message)
        param = (found.group(1) or found.group(2)) if found else None
        raise InvalidRequest(f"Invalid request: {message}", param=param) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec stops at the interpreter's recursion limit (about 1,000 levels).
        raise InvalidRequest("Request body is nested too deeply") from None
