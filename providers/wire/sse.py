"""Server-sent events (WHATWG HTML, "Server-sent events", the event-stream format): one reader
and one writer for every stream the gateway reads or writes.

The rules followed, as the spec gives them:
- A line ends in LF, CRLF or a lone CR. A CR that ends a chunk ends its line at once; an LF
  opening the next chunk is then its pair, not a second line end.
- A blank line dispatches the event. An event with no `data` line is not dispatched (one with
  an empty `data:` line is, with empty data).
- A line starting with ":" is a comment. Otherwise the field name runs to the first ":", and
  the value loses one leading space only (`data:x` and `data: x` are both `x`); a line with no
  colon is a field with an empty value.
- `data` lines join with LF; `event` names the event (empty: no name); `id` and `retry` are
  accepted and ignored (no reconnecting here). A UTF-8 byte order mark opening the stream is
  dropped.

Departures, for what real upstreams send: at the end of the body (`flush`) an event not yet
ended by a blank line is dispatched (many servers close without it, where the spec would drop
it), and a line that is no field of the format (any other name) or longer than `max_line`
marks the stream as `garbage` (an HTML page, a JSON error) rather than passing unremarked.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec

DONE = b"[DONE]"

_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")
_BARE_FIELDS = frozenset((b"data", b"event", b"id", b"retry"))  # a field with no colon
_BOM = b"\xef\xbb\xbf"
_LINE_ENDS = re.compile(rb"(\r\n|\r|\n)")
_LINE_BREAKS = re.compile(rb"\r\n|\r|\n")


class Event(msgspec.Struct, frozen=True):
    """One dispatched event: its data lines joined by LF, and its `event:` name if any."""

    data: bytes
    name: bytes | None = None

    @property
    def done(self) -> bool:
        """The OpenAI-style end of a stream, `data: [DONE]`."""
        return self.data == DONE


class Reader:
    """Incremental SSE parser: bytes in (any chunking), whole events out."""

    __slots__ = ("_cr", "_data", "_fresh", "_name", "_partial", "_skipping", "garbage",
                 "max_line")

    def __init__(self, max_line: int = 1 << 20) -> None:
        self.max_line = max_line
        self.garbage = False  # a line that is no SSE field, or longer than max_line, was seen
        self._partial = bytearray()  # the line not ended yet
        self._skipping = False  # inside a line already past max_line: dropped up to its end
        self._cr = False  # the last chunk ended in CR: an LF opening the next is its pair
        self._fresh = True  # nothing read yet: a byte order mark may open the stream
        self._data: list[bytes] = []
        self._name: bytes | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        """The events `chunk` completes; the rest is kept for the next call."""
        if not chunk:
            return []
        if self._fresh:
            self._fresh = False
            if chunk.startswith(_BOM):
                chunk = chunk[3:]
        if self._cr:
            self._cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if chunk.find(b"\r") >= 0:  # not `in`: see `data`
            self._cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = chunk.split(b"\n")
        tail = lines.pop()
        if not lines:
            self._hold(tail)
            return []
        if self._skipping:  # the rest of an overlong line: ends here, read no further
            self._skipping = False
            del lines[0]
        elif self._partial:
            self._partial += lines[0]
            lines[0] = bytes(self._partial)
            self._partial.clear()
        events = self._lines(lines)
        if tail:
            self._hold(tail)
        return events

    def data(self, chunk: bytes) -> list[bytes]:
        """The data of the events `chunk` completes, as `feed` gives them (names dropped).
        A chunk of whole events of one `data: ` line each, as upstreams write chat chunks, is
        split at once, with no line-by-line reading and no `Event` made."""
        if self._fresh and chunk and not chunk.startswith(_BOM):
            self._fresh = False  # as `feed` would: no byte order mark to drop
        if (self._fresh or self._partial or self._cr or self._data or self._skipping
                or self._name is not None or len(chunk) > self.max_line
                or not chunk.endswith(b"\n\n") or not chunk.startswith(b"data: ")
                or chunk.find(b"\r") >= 0):
            return [event.data for event in self.feed(chunk)]
        found = chunk[6:-2].split(b"\n\ndata: ")
        # Each event one `data: ` line: the only line ends are the blank lines' (no payload
        # holds one; joined, they are searched at memchr's speed, where counting goes byte by
        # byte); otherwise read as any chunk is, line by line. `find`, not `in`: CPython's
        # `bytes in bytes` first tries its operand as an integer, and makes, then drops, a
        # TypeError with its message each time, which costs more than the search.
        if b"".join(found).find(b"\n") >= 0:
            return [event.data for event in self.feed(chunk)]
        return found

    def flush(self) -> list[Event]:
        """At the end of the body: the last line and the event it belongs to, blank line or
        not. The reader then reads a new body (`garbage` stays as it was)."""
        lines = [] if self._skipping or not self._partial else [bytes(self._partial)]
        events = self._lines([*lines, b""])
        self._partial.clear()
        self._skipping = self._cr = False
        self._fresh = True
        return events

    def _hold(self, tail: bytes) -> None:
        if self._skipping or not tail:
            return
        self._partial += tail
        if len(self._partial) > self.max_line:
            self.garbage = self._skipping = True
            self._partial.clear()

    def _lines(self, lines: list[bytes]) -> list[Event]:
        events = []
        longest = self.max_line
        for line in lines:
            if not line:
                if self._data:
                    data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                    events.append(Event(data, self._name))
                    self._data = []
                self._name = None
            elif len(line) > longest:  # as if it had come in pieces: dropped
                self.garbage = True
            elif line.startswith(b"data:"):
                self._data.append(line[6:] if line[5:6] == b" " else line[5:])
            else:
                self._field(line)
        return events

    def _field(self, line: bytes) -> None:
        """A line other than data or blank: a comment, an event name, id, retry, or garbage."""
        if line.startswith(b"event:"):
            name = line[7:] if line[6:7] == b" " else line[6:]
            self._name = name or None
        elif line in _BARE_FIELDS:
            if line == b"data":
                self._data.append(b"")
            elif line == b"event":
                self._name = None
        elif not line.startswith(_FIELDS):
            self.garbage = True


def encode(data: bytes, name: bytes | None = None) -> bytes:
    """One event in the format: `event: name` if named, one `data:` line per line of `data`."""
    if b"\n" in data or b"\r" in data:
        data = b"\ndata: ".join(_LINE_BREAKS.split(data))
    if name is None:
        return b"data: " + data + b"\n\n"
    if b"\n" in name or b"\r" in name:
        raise ValueError(f"an event name is one line: {name!r}")
    return b"event: " + name + b"\ndata: " + data + b"\n\n"


def drop_events(chunk: bytes, unwanted: Callable[[bytes], bool]) -> bytes:
    """`chunk` without the data events whose payload is `unwanted`, each with the blank line
    that ends it; every other byte is kept as it was, and `chunk` itself is returned when
    nothing is dropped.

    It sees one chunk only: an event is the lines between two blank lines of the chunk (or its
    start or end), so an event the chunk holds only part of is judged by that part. Lines that
    are not all SSE fields are never dropped (they may end a line the chunk before began)."""
    if b"data:" not in chunk:
        return chunk
    # line, its end, line, its end, ..., what follows the last end (b"" if the chunk ends one)
    parts = _LINE_ENDS.split(chunk) if b"\r" in chunk else _split_lf(chunk)
    kept: list[bytes] = []
    start = 0  # where the event being read begins in `parts`
    dropped = False
    for at in range(0, len(parts), 2):
        if parts[at] and at + 1 < len(parts):
            continue  # a line of the event
        # a blank line, or the chunk's end: the event before it is judged, with its blank line
        lines = parts[start:at + 1:2]
        if _unwanted(lines, unwanted):
            dropped = True
        else:
            kept += parts[start:at + 2]
        start = at + 2
    return b"".join(kept) if dropped else chunk


def _split_lf(chunk: bytes) -> list[bytes]:
    lines = chunk.split(b"\n")
    parts = [b"\n"] * (2 * len(lines) - 1)
    parts[::2] = lines
    return parts


def _unwanted(lines: list[bytes], unwanted: Callable[[bytes], bool]) -> bool:
    """Whether `lines`, one event's, make a data event whose payload is `unwanted`."""
    reader = Reader()
    found = reader._lines([*lines, b""])
    return len(found) == 1 and not reader.garbage and unwanted(found[0].data)


_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class Framer:
    """Whole events as the bytes they came in: for a reader that rewrites a few events and
    passes every other byte through untouched (`providers.kinds.compat`)."""

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> bytes:
        """The complete events `chunk` ends (with what was held before), blank lines
        included; the rest is held for the next call."""
        if not self._partial and chunk[-2:] == b"\n\n":
            # Whole events, as upstreams write them: a blank line ends the chunk, the last
            # boundary there is whatever its line ends are, so nothing is searched.
            return chunk
        buffer = self._partial + chunk if self._partial else chunk
        end = _last_boundary(buffer)
        if end < 0:
            self._partial = buffer
            return b""
        complete, self._partial = buffer[:end], buffer[end:]
        return complete

    def flush(self) -> bytes:
        """What is held when the body ends."""
        rest, self._partial = self._partial, b""
        return rest


def _last_boundary(buffer: bytes) -> int:
    """Where the last blank line of `buffer` ends, or -1."""
    if buffer.find(b"\r") < 0:  # not `in`: see `Reader.data`
        at = buffer.rfind(b"\n\n")
        return at + 2 if at >= 0 else -1
    ends = [m.end() for m in _BOUNDARY.finditer(buffer)]
    return ends[-1] if ends else -1


def split(complete: bytes) -> list[bytes]:
    """Complete events (`Framer.feed`) one by one, each with the blank line that ends it."""
    if b"\r" not in complete:
        parts = complete.split(b"\n\n")
        return [part + b"\n\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    events, start = [], 0
    for match in _BOUNDARY.finditer(complete):
        events.append(complete[start:match.end()])
        start = match.end()
    if start < len(complete):
        events.append(complete[start:])
    return events


def data_of(complete: bytes) -> list[bytes]:
    """The data of complete events (`Framer.feed`), for a reader that looks at every event of
    a stream it passes on: split on blank lines when each event is one `data: ` line, as
    upstreams write chat chunks; by a `Reader` otherwise."""
    if complete.startswith(b"data: ") and complete.find(b"\n") == len(complete) - 2:
        return [complete[6:-2]]  # one event, the most common chunk
    if b"\r" not in complete:
        parts = complete.split(b"\n\n")
        if not parts[-1] and all(p.startswith(b"data: ") and b"\n" not in p
                                 for p in parts[:-1]):
            return [p[6:] for p in parts[:-1]]
    return [event.data for event in Reader().feed(complete)]


def parse(raw: bytes) -> Event | None:
    """One event's bytes as the event they make (None: no data line, as a comment)."""
    found = Reader().feed(raw if raw.endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))
                          else raw + b"\n\n")
    return found[0] if found else None
