"""A `multipart/form-data` body (an audio or image upload), read and changed as bytes.

The gateway reads only the text fields it routes by (`model`) and rewrites only the model's value
for the provider that serves it; every other part, the uploaded file included, goes on as the
client sent its bytes. The body is at hand whole (bounded by the upload limit before it was read):
failover sends it again to the next candidate.

The framing is read by `multipart`'s `PushMultipartParser` (the parser Litestar uses), with its
limits on headers and parts; this module only places each part's value in the body, from the
sizes the parser counted, so that a value can be replaced in place.
"""

from __future__ import annotations

from dataclasses import dataclass

from multipart import (
    MultipartError,
    MultipartSegment,
    ParserLimitReached,
    PushMultipartParser,
    parse_content_disposition,
    parse_options_header,
)

from providers.contract.errors import InvalidRequest

MAX_FIELD = 64 * 1024  # a text field the gateway reads; an upload's other fields are not read
MAX_BOUNDARY = 200  # RFC 2046 allows 70 characters; more is not a client's upload
# Parts in one body: OpenAI's largest upload (an image edit) has a few fields and at most 16
# images; each part costs the parser an object, so a body of tiny parts is refused early.
MAX_PARTS = 1000
# The request's Content-Type: a type, a boundary, perhaps a charset. Its parameters are read by
# a regular expression and sent upstream as they came, so their number and size are bounded.
MAX_CONTENT_TYPE = 1024
MAX_PARAMETERS = 8
# A part's header line (its Content-Disposition: a name and a file name) and how many it has:
# RFC 7578 defines three headers; browsers write one or two.
MAX_PART_HEADER = 1024
MAX_PART_HEADERS = 4
_HEADER_END = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Part:
    """One part: its field name, its file name (None for a text field), where its value is."""

    name: str
    filename: str | None
    start: int  # the value's first byte in the body
    end: int  # past its last byte


def boundary(content_type: str | None) -> bytes:
    """The boundary a `multipart/form-data` content type declares; a 400 for anything else,
    naming the header when it is past its bounds."""
    given = content_type or ""
    if len(given) > MAX_CONTENT_TYPE or given.count(";") > MAX_PARAMETERS:
        raise InvalidRequest(f"Content-Type is over {MAX_CONTENT_TYPE} characters or "
                             f"{MAX_PARAMETERS} parameters", param="content-type")
    kind, options = parse_options_header(given)
    if kind != "multipart/form-data":
        raise InvalidRequest("Request body must be multipart/form-data (an upload)")
    found = options.get("boundary")
    if not isinstance(found, str) or not found or len(found) > MAX_BOUNDARY \
            or not found.isascii():
        raise InvalidRequest("multipart/form-data without a boundary")
    return found.encode("ascii")


def parts(body: bytes, content_type: str | None) -> list[Part]:
    """The body's parts, in order; a 400 naming what is wrong with its framing."""
    return _read(body, content_type)[0]


def _read(body: bytes, content_type: str | None) -> tuple[list[Part], int]:
    """The body's parts, and where its closing delimiter starts."""
    marker = boundary(content_type)
    at = body.find(b"--" + marker)  # where the parser finds its first delimiter too
    if at < 0:
        raise InvalidRequest("multipart body has no part")
    found: list[Part] = []
    # The framing is checked by the parser: each value is the `size` bytes after its head, and
    # the next delimiter follows it. A head holds no blank line, so its end is the first one.
    for segment in _segments(body, marker):
        start = body.find(_HEADER_END, at + len(marker) + 2) + len(_HEADER_END)
        end = start + segment.size
        if not body.startswith(b"\r\n--" + marker, end):  # never, for what the parser read
            raise InvalidRequest("multipart body is malformed or ended before its last part")
        found.append(Part(_name(segment), segment.filename, start, end))
        at = end + 2  # the next delimiter, after the line break that belongs to it
    return found, at


def _segments(body: bytes, marker: bytes) -> list[MultipartSegment]:
    """The parts' heads as the parser read them, every one complete."""
    segments: list[MultipartSegment] = []
    try:
        parser = PushMultipartParser(marker, max_segment_count=MAX_PARTS,
                                     max_header_size=MAX_PART_HEADER,
                                     max_header_count=MAX_PART_HEADERS)
        segments += (event for event in parser.parse(body)
                     if isinstance(event, MultipartSegment))
        parser.close()  # a body that ended before its closing delimiter is refused here
    except ParserLimitReached as exc:
        raise _over(str(exc), len(segments)) from None
    except MultipartError as exc:
        if "Content-Disposition" in str(exc):
            raise InvalidRequest("multipart part without a Content-Disposition") from None
        raise InvalidRequest("multipart body is malformed or ended before its last part"
                             ) from None
    return segments


def _over(limit: str, read: int) -> InvalidRequest:
    """The 400 for a body past one of the parser's bounds, naming what is past it."""
    if "count" in limit and "header" not in limit:
        return InvalidRequest(f"multipart body has more than {MAX_PARTS} parts")
    return InvalidRequest(f"multipart part {read + 1} is over a bound on its headers "
                          f"({MAX_PART_HEADERS} header lines of {MAX_PART_HEADER} bytes each, "
                          "its parameters included)", param="content-disposition")


def _name(segment: MultipartSegment) -> str:
    # Without `name` the parser (not strict) says "": only a header naming none is refused.
    name = segment.name
    if not name and parse_content_disposition(segment.header("Content-Disposition", ""))[1] \
            is None:
        raise InvalidRequest("multipart part without a field name")
    return str(name)


def fields(body: bytes, content_type: str | None) -> dict[str, str]:
    """The text fields (not files) by name, the last one kept; values longer than `MAX_FIELD`
    are not read."""
    found = {}
    for part in parts(body, content_type):
        if part.filename is None and part.end - part.start <= MAX_FIELD:
            try:
                found[part.name] = body[part.start:part.end].decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest(f"Field '{part.name}' is not UTF-8",
                                     param=part.name) from None
    return found


def files(body: bytes, content_type: str | None) -> set[str]:
    """The names of the fields that carry a file."""
    return {p.name for p in parts(body, content_type) if p.filename is not None}


def with_field(body: bytes, content_type: str | None, name: str, value: str) -> bytes:
    """The same body with text field `name` set to `value` (every copy of it; added at the
    end if absent); every other byte as it was."""
    encoded = value.encode("utf-8")
    found, close = _read(body, content_type)
    chosen = [p for p in found if p.name == name and p.filename is None]
    if not chosen:
        delimiter = b"--" + boundary(content_type)
        added = (delimiter + b'\r\nContent-Disposition: form-data; name="'
                 + name.encode("utf-8") + b'"\r\n\r\n' + encoded + b"\r\n")
        return body[:close] + added + body[close:]
    pieces, last = [], 0
    for part in chosen:
        pieces += [body[last:part.start], encoded]
        last = part.end
    return b"".join([*pieces, body[last:]])
