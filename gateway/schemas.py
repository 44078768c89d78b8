"""The few request fields the gateway reads, typed; everything else passes through untouched."""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec

from gateway.errors import InvalidRequest

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class Message(msgspec.Struct):
    """A chat message; only its role is checked here, the provider checks the rest."""

    role: NonEmptyStr
    content: Any = None


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class ChatHead(msgspec.Struct):
    """What routing needs from a chat-completions body."""

    model: NonEmptyStr
    messages: Annotated[list[Message], msgspec.Meta(min_length=1)]
    stream: bool | None = False
    stream_options: StreamOptions | None = None


# msgspec allows one array-like per union: the element union covers strings, token ids and
# lists of token ids; a mixed list is left for the provider to refuse.
Prompt = str | list[str | int | list[int]]


class CompletionHead(msgspec.Struct):
    """What routing needs from a legacy completions body."""

    model: NonEmptyStr
    prompt: Prompt
    stream: bool | None = False
    stream_options: StreamOptions | None = None


class ResponsesHead(msgspec.Struct):
    """What routing needs from a Responses API body."""

    model: NonEmptyStr
    input: str | list[Any] | None = None
    stream: bool | None = False


Head = TypeVar("Head", bound=msgspec.Struct)

_FIELD = re.compile(r"`\$\.(\w+)|required field `(\w+)`")


def parse(raw: bytes, head: type[Head]) -> Head:
    """Decode and check `raw` as `head`; InvalidRequest names the field that is wrong."""
    if not raw.strip():
        raise InvalidRequest("Request body is empty; expected a JSON object")
    try:
        return msgspec.json.decode(raw, type=head)
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
