"""A `multipart/form-data` body (an audio or image upload), read and changed as bytes.

The gateway reads only the text fields it routes by (`model`) and rewrites only the model's value
for the provider that serves it; every other part, the uploaded file included, goes on as the
client sent its bytes. The body is at hand whole (bounded by the upload limit before it was read):
failover sends it again to the next candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message

from providers.contract.errors import InvalidRequest

MAX_FIELD = 64 * 1024  # a text field the gateway reads; an upload's other fields are not read
_DISPOSITION = re.compile(rb'^content-disposition:(.*)$', re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Part:
    """One part: its field name, its file name (None for a text field), where its value is."""

    name: str
    filename: str | None
    start: int  # the value's first byte in the body
    end: int  # past its last byte


def boundary(content_type: str | None) -> bytes:
    """The boundary a `multipart/form-data` content type declares; a 400 for anything else."""
    message = Message()
    message["content-type"] = content_type or ""
    if message.get_content_type() != "multipart/form-data":
        raise InvalidRequest("Request body must be multipart/form-data (an upload)")
    found = message.get_param("boundary")
    if not isinstance(found, str) or not found or len(found) > 200:
        raise InvalidRequest("multipart/form-data without a boundary")
    return found.encode("latin-1")


def parts(body: bytes, content_type: str | None) -> list[Part]:
    """The body's parts, in order; a 400 naming what is wrong with its framing."""
    delimiter = b"--" + boundary(content_type)
    found: list[Part] = []
    at = body.find(delimiter)
    if at < 0:
        raise InvalidRequest("multipart body has no part")
    while True:
        at += len(delimiter)
        if body[at:at + 2] == b"--":  # the closing delimiter
            return found
        head_end = body.find(b"\r\n\r\n", at)
        following = body.find(b"\r\n" + delimiter, at)
        if head_end < 0 or following < 0 or head_end > following:
            raise InvalidRequest("multipart body is malformed or ended before its last part")
        found.append(_part(body[at:head_end], head_end + 4, following))
        at = following + 2


def _part(head: bytes, start: int, end: int) -> Part:
    match = _DISPOSITION.search(head)
    if match is None:
        raise InvalidRequest("multipart part without a Content-Disposition")
    message = Message()
    message["content-disposition"] = match.group(1).decode("utf-8", "replace").strip()
    name = message.get_param("name", header="content-disposition")
    filename = message.get_param("filename", header="content-disposition")
    if not isinstance(name, str):
        raise InvalidRequest("multipart part without a field name")
    return Part(name, filename if isinstance(filename, str) else None, start, end)


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
    chosen = [p for p in parts(body, content_type) if p.name == name and p.filename is None]
    if not chosen:
        delimiter = b"--" + boundary(content_type)
        close = body.rfind(delimiter + b"--")
        added = (delimiter + b'\r\nContent-Disposition: form-data; name="'
                 + name.encode("utf-8") + b'"\r\n\r\n' + encoded + b"\r\n")
        return body[:close] + added + body[close:]
    pieces, last = [], 0
    for part in chosen:
        pieces += [body[last:part.start], encoded]
        last = part.end
    return b"".join([*pieces, body[last:]])
