"""The OpenAI chat-completions body as the translating kinds read it, typed.

A kind that rewrites the body into another wire format (Anthropic's, Gemini's) starts with
`checked(body, ChatRequest)`: every field its translator reads is converted here, once, so a wrong
type is an `InvalidRequest` naming its place (`messages[0].content[0].text`), never a `TypeError`
deep in a translator. Only types are checked: unknown fields and values are left to the upstream,
and the dict the translator reads is the body as the client sent it.

The relay's head (`gateway.core.schemas.ChatHead`) uses the message and tool types too, so
every kind, the relaying ones included, refuses the same wrong shapes with the same `param`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec

from providers.contract.errors import InvalidRequest

NonEmptyStr = Annotated[str, msgspec.Meta(min_length=1)]


class ImageUrl(msgspec.Struct):
    url: str = ""
    detail: str | None = None


class InputAudio(msgspec.Struct):
    data: str = ""
    format: str = "wav"


class FileData(msgspec.Struct):
    file_data: str | None = None


class ContentPart(msgspec.Struct):
    """One part of a message's content; a part of a type no kind knows passes untouched."""

    type: str | None = None
    text: str = ""
    image_url: str | ImageUrl | None = None  # OpenAI sends an object; some clients a URL
    input_audio: InputAudio | None = None
    file: FileData | None = None


Content = str | list[ContentPart] | None


class FunctionCall(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ToolCall(msgspec.Struct):
    # Optional: a call of a custom tool carries `custom` (free-form input) instead.
    function: FunctionCall | None = None
    id: str | None = None
    type: str | None = None
    # Gemini's thought signature travels here (`extra_content.google.thought_signature`).
    extra_content: dict[str, dict[str, Any] | None] | None = None


class Message(msgspec.Struct):
    """A chat message: its role, and the types of what translators read."""

    role: NonEmptyStr
    content: Content = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDefinition(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct):
    type: str = "function"
    function: FunctionDefinition | None = None


class NamedFunction(msgspec.Struct):
    name: str


class ToolChoice(msgspec.Struct):
    type: str | None = None
    function: NamedFunction | None = None


class JsonSchema(msgspec.Struct):
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct):
    type: str
    json_schema: JsonSchema | None = None


Stop = str | Annotated[list[str], msgspec.Meta(max_length=4)] | None


class ChatRequest(msgspec.Struct):
    """Every field a translating kind reads of a chat-completions body."""

    messages: list[Message]
    stream: bool | None = None
    stop: Stop = None
    n: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: list[Tool] | None = None
    tool_choice: str | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str | None = None
    user: str | None = None


Shape = TypeVar("Shape", bound=msgspec.Struct)


def content_text(content: Any) -> str:
    """A message's `content` as plain text: a string as it is, the text parts of a list
    joined (other parts dropped), nothing for none."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def checked(body: Mapping[str, Any], shape: type[Shape]) -> Shape:
    """`body` converted to `shape`; InvalidRequest names the field that is wrong."""
    try:
        return msgspec.convert(body, shape)
    except msgspec.ValidationError as exc:
        raise InvalidRequest.from_msgspec(exc) from None


# Every spelling clients ask for an answer's length with: chat's two, the Responses API's.
OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def output_limit(*said: object) -> int | None:
    """The longest answer a request allows, whichever spellings it sent: the largest. Every
    kind and bridge sends this one upstream, so a budget's hold assumes what is sent."""
    values = [v for v in said if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return max(values) if values else None


def asked_output(body: Mapping[str, Any]) -> int | None:
    """`output_limit` of a body's `OUTPUT_FIELDS`."""
    return output_limit(*(body.get(name) for name in OUTPUT_FIELDS))
