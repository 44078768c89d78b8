"""The batch files, pure: an input file read line by line into requests (a bad line is a 400
naming it); the lines of the output and error files OpenAI's batches write are
`providers.contract.batches`, re-exported here."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from gateway.core.settings import BatchesConfig
from providers.contract.batches import answered, request_id, unanswered
from providers.contract.errors import InvalidRequest

__all__ = ["ENDPOINTS", "Request", "answered", "parse", "request_id", "unanswered"]

# What a batch's requests may call: the URL a line names, the pipeline's endpoint for it.
ENDPOINTS = {"/v1/chat/completions": "chat/completions", "/v1/embeddings": "embeddings",
             "/v1/completions": "completions"}


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


class _Head(msgspec.Struct):
    model: str
    stream: bool | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One line of an input file: its number (from 1), its ids, where it goes, its body."""

    line: int
    custom_id: str
    url: str
    model: str
    body: bytes


def parse(content: bytes, bounds: BatchesConfig) -> list[Request]:
    """Every request of a batch input file; InvalidRequest naming the first line that is not
    one (not JSON, a field missing, a URL not served, a custom_id seen before, too long)."""
    found: list[Request] = []
    seen: set[str] = set()
    lines = content.split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline that ends the last line
    if len(lines) > bounds.max_lines:
        raise InvalidRequest(f"The file has {len(lines)} lines; a batch file may have at most "
                             f"{bounds.max_lines}", param="file")
    for number, text in enumerate(lines, 1):
        if len(text) > bounds.max_line_bytes:
            raise _bad(number, f"is {len(text)} bytes long, more than the "
                               f"{bounds.max_line_bytes} a line may be")
        request = _request(number, text)
        if request.custom_id in seen:
            raise _bad(number, f"repeats the custom_id '{request.custom_id[:64]}': each "
                               "request's must be unique")
        seen.add(request.custom_id)
        found.append(request)
    if not found:
        raise InvalidRequest("The file has no request: a batch file is one JSON request per "
                             "line", param="file")
    return found


def _request(number: int, text: bytes) -> Request:
    try:
        line = msgspec.json.decode(text, type=_Line)
        head = msgspec.json.decode(line.body, type=_Head)
    except msgspec.DecodeError as exc:
        raise _bad(number, f"is not a batch request ({exc}); each line is "
                           '{"custom_id", "method": "POST", "url", "body": {"model", ...}}'
                   ) from None
    if line.method != "POST":
        raise _bad(number, f"has method '{line.method[:16]}': only POST is supported")
    if line.url not in ENDPOINTS:
        raise _bad(number, f"has url '{line.url[:64]}': one of {', '.join(ENDPOINTS)} is "
                           "supported")
    if head.stream:
        raise _bad(number, "asks for a stream: a batch's answers are whole")
    if not line.custom_id or len(line.custom_id) > 512:
        raise _bad(number, "has a custom_id that is empty or longer than 512 characters")
    return Request(number, line.custom_id, line.url, head.model, bytes(line.body))


def _bad(number: int, problem: str) -> InvalidRequest:
    return InvalidRequest(f"Line {number} of the file {problem}", param="file")
