"""Anthropic's Message Batches behind OpenAI's Batch API, pure: an OpenAI batch input file's
lines as a message batch's requests, a message batch as OpenAI's `Batch`, and its results as
OpenAI's output and error files.

`AnthropicProvider.batch_api` makes the calls; the chat translation is the kind's own
(`to_messages`, `to_chat_completion`), passed in. Anthropic keeps no input file: the gateway
keeps it (`Provider.batch_files`). A batch's output and error files are named after it
(`file-{batch}-output`), so reading one needs nothing kept but the batch's id.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any, Literal

import msgspec

from providers.contract.batches import answered, unanswered
from providers.contract.errors import ANTHROPIC_TYPES, BadUpstreamResponse, InvalidRequest
from providers.wire.upstream_errors import scrub

ENDPOINT = "/v1/chat/completions"  # what a message batch's requests are, in OpenAI's terms
WINDOW = "24h"  # a message batch's, as OpenAI's
OUTPUT, ERRORS = "output", "errors"
# Anthropic refuses other custom_ids (a 400 for the whole batch).
CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
FILE_ID = re.compile(r"file-([A-Za-z0-9_-]+)-(output|errors)")
# The HTTP status of each Anthropic error type (the first, where two types share one).
STATUSES = {kind: status for status, kind in reversed(ANTHROPIC_TYPES.items())}
# Requests a message batch never ran: the error file's code and message, as OpenAI's.
_UNRUN = {"canceled": ("batch_cancelled", "This request was not run: the batch was "
                                          "cancelled first."),
          "expired": ("batch_expired", "This request could not be executed before the "
                                       "completion window expired.")}
_ENDED = {"completed": "completed_at", "cancelled": "cancelled_at", "expired": "expired_at"}

Params = Callable[[dict[str, Any], str], dict[str, Any]]  # a chat body, its upstream model
Chat = Callable[[Mapping[str, Any], str], dict[str, Any]]


class _Request(msgspec.Struct):
    custom_id: str
    url: str
    body: dict[str, Any]


class Counts(msgspec.Struct, frozen=True):
    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(msgspec.Struct, frozen=True):
    """The fields of Anthropic's `message_batch` the translation reads."""

    id: str
    type: Literal["message_batch"]
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: Counts
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None
    results_url: str | None = None


class _Result(msgspec.Struct):
    type: str
    message: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class _Line(msgspec.Struct):
    custom_id: str
    result: _Result


def requests(lines: bytes, params: Params) -> dict[str, Any]:
    """The message batch's body for an OpenAI batch input file whose models are already the
    upstream's; InvalidRequest names the first line Anthropic would not take."""
    found = []
    for number, text in enumerate(lines.splitlines(), 1):
        try:
            line = msgspec.json.decode(text, type=_Request)
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f"Line {number} of the file is not a batch request ({exc})",
                                 param="file") from None
        if line.url != ENDPOINT:
            raise InvalidRequest(f"Line {number} of the file calls {line.url[:64]}: "
                                 f"Anthropic's message batches run {ENDPOINT} only",
                                 param="file")
        if not CUSTOM_ID.fullmatch(line.custom_id):
            raise InvalidRequest(f"Line {number} of the file has a custom_id Anthropic does not "
                                 "take: 1 to 64 letters, digits, '-' or '_'", param="file")
        asked = params(line.body, str(line.body.get("model", "")))
        asked.pop("stream", None)  # a batch's answers are whole
        found.append({"custom_id": line.custom_id, "params": asked})
    return {"requests": found}


def read_batch(payload: bytes) -> MessageBatch:
    """Anthropic's answer as a message batch; a bad upstream answer if it is not one."""
    try:
        return msgspec.json.decode(payload, type=MessageBatch)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadUpstreamResponse(f"response is not a message batch: {exc}") from None


def status(batch: MessageBatch) -> str:
    """OpenAI's status for a message batch: an ended one is cancelled if a cancel was asked,
    expired if requests ran out of time, else completed."""
    if batch.processing_status == "in_progress":
        return "in_progress"
    if batch.processing_status == "canceling":
        return "cancelling"
    if batch.cancel_initiated_at is not None:
        return "cancelled"
    return "expired" if batch.request_counts.expired else "completed"


def file_id(batch_id: str, which: str) -> str:
    """The id of a batch's output or error file."""
    return f"file-{batch_id}-{which}"


def batch_object(batch: MessageBatch) -> dict[str, Any]:
    """OpenAI's `Batch` for a message batch, without what Anthropic does not keep (the input
    file, the metadata): the gateway adds those from its own row."""
    counts, now = batch.request_counts, status(batch)
    shown: dict[str, Any] = {
        "id": batch.id, "object": "batch", "endpoint": ENDPOINT, "completion_window": WINDOW,
        "status": now, "created_at": int(batch.created_at.timestamp()),
        "in_progress_at": int(batch.created_at.timestamp()),
        "expires_at": int(batch.expires_at.timestamp()),
        "request_counts": {"total": sum(msgspec.structs.astuple(counts)),
                           "completed": counts.succeeded, "failed": counts.errored}}
    if batch.cancel_initiated_at is not None:
        shown["cancelling_at"] = int(batch.cancel_initiated_at.timestamp())
    if batch.ended_at is not None and now in _ENDED:
        shown[_ENDED[now]] = int(batch.ended_at.timestamp())
        if counts.succeeded:
            shown["output_file_id"] = file_id(batch.id, OUTPUT)
        if counts.errored + counts.canceled + counts.expired:
            shown["error_file_id"] = file_id(batch.id, ERRORS)
    return shown


def results_file(results: bytes, which: str, chat: Chat) -> bytes:
    """OpenAI's output (`which`: OUTPUT) or error file for a message batch's results."""
    return b"".join(line + b"\n" for line in _lines(results, which, chat))


def _lines(results: bytes, which: str, chat: Chat) -> Iterator[bytes]:
    for text in results.splitlines():
        if not text.strip():
            continue
        try:
            line = msgspec.json.decode(text, type=_Line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BadUpstreamResponse(f"a result is not a message batch's: {exc}") from None
        result = line.result
        if result.type == "succeeded" and which == OUTPUT:
            message = result.message or {}
            yield answered(line.custom_id, 200, str(message.get("id", "")),
                           msgspec.json.encode(chat(message, "")))
        elif result.type == "errored" and which == ERRORS:
            yield _errored(line.custom_id, result.error or {})
        elif result.type in ("canceled", "expired") and which == ERRORS:
            yield unanswered(line.custom_id, *_UNRUN[result.type])


def _errored(custom_id: str, error: Mapping[str, Any]) -> bytes:
    """The error file's line for a request Anthropic answered with an error: its status and
    OpenAI's error envelope, as the client would have had them."""
    # An error response `{"type": "error", "error": {...}, "request_id"}`, or the bare error.
    found = error.get("error")
    inner: Mapping[str, Any] = found if isinstance(found, dict) else error
    kind = str(inner.get("type") or "api_error")
    body = {"error": {"message": scrub(str(inner.get("message") or kind)), "type": kind,
                      "param": None, "code": None}}
    return answered(custom_id, STATUSES.get(kind, 500), str(error.get("request_id") or ""),
                    msgspec.json.encode(body))
