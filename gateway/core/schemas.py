"""The few request fields the gateway reads, typed; everything else passes through untouched."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgspec

from providers.contract import form
from providers.contract.chat import (
    Message,
    NonEmptyStr,
    ResponseFormat,
    Stop,
    Tool,
    ToolChoice,
)
from providers.contract.embeddings import MAX_INPUTS
from providers.contract.errors import InvalidRequest
from providers.contract.numbers import check_numbers

# The shapes the provider kinds' translators read (Anthropic's, Gemini's, the Responses
# bridge's) are checked here too, once for every kind, so a wrong type is a 400 naming its place
# whichever provider would have served it. Only types are checked; unknown fields and values pass
# through untouched.


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


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
    tools: list[Tool] | None = None
    tool_choice: str | ToolChoice | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None


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


class InputPart(msgspec.Struct):
    """A part of a Responses message's content (`input_text`, `input_image`, ...)."""

    type: str | None = None
    text: str = ""
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputItem(msgspec.Struct):
    """A Responses `input` item, of any type: the fields the bridge reads, by type."""

    type: str = "message"
    role: str | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None


class ResponsesTool(msgspec.Struct):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None


class TextConfig(msgspec.Struct):
    format: dict[str, Any] | None = None


class ReasoningConfig(msgspec.Struct):
    effort: str | None = None


class ResponsesHead(msgspec.Struct):
    """What routing needs from a Responses API body, and the types the bridge reads."""

    model: NonEmptyStr
    input: str | list[InputItem] | None = None
    stream: bool | None = False
    previous_response_id: str | None = None
    store: bool | None = True
    tools: list[ResponsesTool] | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    instructions: str | None = None

    def __post_init__(self) -> None:
        check_items(self.input)


def check_items(items: str | list[InputItem] | None) -> None:
    """Each input item has the fields its type needs (msgspec cannot say it per type)."""
    for number, item in enumerate(items if isinstance(items, list) else ()):
        for field_name in _ITEM_NEEDS.get(item.type, ()):
            if getattr(item, field_name) is None:
                raise msgspec.ValidationError(
                    f"Object missing required field `{field_name}` - at `$.input[{number}]`")


# OpenAI's own bounds: 2,048 inputs a request; an empty string is refused, as it is there.
MAX_EMBEDDING_INPUTS = MAX_INPUTS
EmbeddingInput = str | list[str | int | list[int]]


class EmbeddingsHead(msgspec.Struct):
    """What routing needs from an embeddings body; kinds that translate read `input` as
    checked here (`providers.contract.embeddings`)."""

    model: NonEmptyStr
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        given = self.input
        if given == "" or given == []:
            raise msgspec.ValidationError("Expected a non-empty input - at `$.input`")
        if isinstance(given, str) or all(isinstance(x, int) for x in given):
            return
        if len(given) > MAX_EMBEDDING_INPUTS:
            raise msgspec.ValidationError(
                f"Expected at most {MAX_EMBEDDING_INPUTS} inputs - at `$.input`")
        kinds = {type(x) for x in given}
        if len(kinds) > 1:
            raise msgspec.ValidationError(
                "Expected inputs of one kind (strings or token arrays) - at `$.input`")
        for number, item in enumerate(given):
            if item == "" or item == []:
                raise msgspec.ValidationError(f"Expected a non-empty input - at "
                                              f"`$.input[{number}]`")


class ModerationsHead(msgspec.Struct):
    """A moderations body: what routing reads (OpenAI's default model when none is named)."""

    input: str | list[Any]
    model: NonEmptyStr = "omni-moderation-latest"


class RerankHead(msgspec.Struct):
    """A rerank body in the Cohere/Jina shape (vLLM's `/v1/rerank`)."""

    model: NonEmptyStr
    query: str
    documents: Annotated[list[str | dict[str, Any]], msgspec.Meta(min_length=1)]
    top_n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_documents: bool | None = None


class ImagesHead(msgspec.Struct):
    """An image generation body (OpenAI's default model when none is named)."""

    prompt: NonEmptyStr
    model: NonEmptyStr = "dall-e-2"
    n: Annotated[int, msgspec.Meta(ge=1, le=10)] | None = None
    response_format: Literal["url", "b64_json"] | None = None


class SpeechHead(msgspec.Struct):
    """A text-to-speech body; its answer is audio bytes, relayed as they come."""

    model: NonEmptyStr
    input: NonEmptyStr
    voice: str | dict[str, Any]
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] | None = None


class FormHead(msgspec.Struct):
    """What routing reads of a `multipart/form-data` upload: its text fields, the file fields
    it must carry (`files`); the body itself is relayed as its bytes came."""

    model: NonEmptyStr
    files: ClassVar[tuple[str, ...]] = ()


class TranscriptionHead(FormHead):
    """`/v1/audio/transcriptions` and `/translations`: an audio `file` and its model."""

    files: ClassVar[tuple[str, ...]] = ("file",)


class ImageEditHead(FormHead, kw_only=True):
    """`/v1/images/edits`: one or more `image` files (`image[]` from the SDK), a prompt."""

    prompt: NonEmptyStr
    model: NonEmptyStr = "dall-e-2"
    files: ClassVar[tuple[str, ...]] = ("image",)


# What the bridge needs of each input item type (`gateway.adapters.responses.request`).
_ITEM_NEEDS = {"message": ("role",), "function_call": ("call_id", "name"),
               "function_call_output": ("call_id",)}


Head = TypeVar("Head", bound=msgspec.Struct)

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


def _check_unread(raw: bytes) -> None:
    """What the typed decode skips must still be what every kind can read: UTF-8 throughout
    (msgspec does not check the strings it skips)."""
    if not raw.isascii():
        raw.decode("utf-8")  # UnicodeDecodeError: answered as a 400 by `parse`


# A body past this many bytes is parsed on a thread (`parsed`), not in the event loop: its
# parse takes long enough to hold up every other request of the process.
SLOW_PARSE = 1024 * 1024


async def parsed(raw: bytes, head: type[Head], content_type: str | None = None
                 ) -> tuple[Head, bytes]:
    """`parse`, on a thread for a body past `SLOW_PARSE` (a large upload's multipart framing,
    a long JSON document): the event loop goes on serving other requests meanwhile."""
    if len(raw) <= SLOW_PARSE:
        return parse(raw, head, content_type)
    return await asyncio.to_thread(parse, raw, head, content_type)


def parse(raw: bytes, head: type[Head], content_type: str | None = None
          ) -> tuple[Head, bytes]:
    """Decode and check `raw` as `head`, returning the body to forward (extra_body merged);
    InvalidRequest names the field that is wrong. An upload (`FormHead`) is read as one."""
    if issubclass(head, FormHead):
        return parse_form(raw, head, content_type), raw
    if not raw.strip():
        raise InvalidRequest("Request body is empty; expected a JSON object")
    check_numbers(raw)  # before anything decodes the body untyped and takes a big int as it is
    if raw.find(b'"extra_body"') >= 0:
        raw = merge_extra_body(raw)
    try:
        parsed = msgspec.json.decode(raw, type=head)
        _check_unread(raw)
        return parsed, raw
    except msgspec.ValidationError as exc:
        raise InvalidRequest.from_msgspec(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:  # msgspec's own, for bytes inside a string
        raise InvalidRequest(f"Request body is not UTF-8 (byte {exc.start})") from None
    except RecursionError:
        # msgspec stops at the interpreter's recursion limit (about 1,000 levels).
        raise InvalidRequest("Request body is nested too deeply") from None


Form = TypeVar("Form", bound=FormHead)


def parse_form(raw: bytes, head: type[Form], content_type: str | None) -> Form:
    """An upload's text fields checked as `head`, and the files it must carry there."""
    fields = form.fields(raw, content_type)
    uploaded = form.files(raw, content_type)
    for name in head.files:
        if name not in uploaded and f"{name}[]" not in uploaded:
            raise InvalidRequest(f"Invalid request: Object missing required field `{name}`",
                                 param=name)
    known = {f: fields[f] for f in head.__struct_fields__ if f in fields}
    try:
        return msgspec.convert(known, head)
    except msgspec.ValidationError as exc:
        raise InvalidRequest.from_msgspec(exc) from None
