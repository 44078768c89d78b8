"""One reader of server-sent events for every stream: the same events however the bytes come."""

from __future__ import annotations

import random

import pytest

from providers.wire.sse import DONE, Event, Reader, data_of, drop_events, encode

# A stream as upstreams write it: comments, names, ids, multi-line data, CRLF, a lone CR.
SAMPLE = (b": hello\r\n\r\n"
          b"event: message_start\r\ndata: {\"a\": 1}\r\n\r\n"
          b"id: 7\nretry: 100\ndata: one\ndata:two\n\n"
          b"data: lone\r\rdata: [DONE]\n\n")
SAMPLE_EVENTS = [Event(b'{"a": 1}', b"message_start"), Event(b"one\ntwo"),
                 Event(b"lone"), Event(DONE)]


def read(*chunks: bytes, flush: bool = True) -> list[Event]:
    reader = Reader()
    events = [event for chunk in chunks for event in reader.feed(chunk)]
    return events + reader.flush() if flush else events


@pytest.mark.parametrize(("stream", "events"), [
    pytest.param(b"data: x\n\n", [Event(b"x")], id="LF"),
    pytest.param(b"data: x\r\n\r\n", [Event(b"x")], id="CRLF"),
    pytest.param(b"data: x\r\r", [Event(b"x")], id="lone CR"),
    pytest.param(b"data: x\r\n\rdata: y\n\r\n", [Event(b"x"), Event(b"y")], id="mixed ends"),
    pytest.param(b"data:x\n\ndata:  x\n\n", [Event(b"x"), Event(b" x")],
                 id="one leading space only"),
    pytest.param(b"data: a\ndata: b\ndata:\n\n", [Event(b"a\nb\n")], id="multi-line data"),
    pytest.param(b"data:\n\n", [Event(b"")], id="empty data is an event"),
    pytest.param(b"data\n\n", [Event(b"")], id="a field with no colon"),
    pytest.param(b": ping\n\n:\n\n", [], id="comments only"),
    pytest.param(b": ping\ndata: x\n: pong\n\n", [Event(b"x")], id="comments inside"),
    pytest.param(b"event: delta\ndata: x\n\ndata: y\n\n", [Event(b"x", b"delta"), Event(b"y")],
                 id="a name lasts one event"),
    pytest.param(b"event:\ndata: x\n\n", [Event(b"x")], id="an empty name is none"),
    pytest.param(b"event: ping\n\ndata: x\n\n", [Event(b"x")], id="no data, no event"),
    pytest.param(b"id: 1\nretry: 5\ndata: x\n\n", [Event(b"x")], id="id and retry ignored"),
    pytest.param(b"\n\n\ndata: x\n\n\n\n", [Event(b"x")], id="extra blank lines"),
    pytest.param(b"\xef\xbb\xbfdata: x\n\n", [Event(b"x")], id="byte order mark"),
    pytest.param(b"data: [DONE]\n\n", [Event(DONE)], id="DONE"),
])
def test_each_rule_of_the_format(stream: bytes, events: list[Event]) -> None:
    assert read(stream) == events


def test_done_is_the_openai_end_of_stream() -> None:
    assert Event(b"[DONE]").done and not Event(b"[DONE] ").done and not Event(b"{}").done


def test_every_split_of_a_stream_gives_the_same_events() -> None:
    assert read(SAMPLE) == SAMPLE_EVENTS
    for at in range(len(SAMPLE) + 1):
        assert read(SAMPLE[:at], SAMPLE[at:]) == SAMPLE_EVENTS, at
    for at in range(len(SAMPLE)):
        for end in range(at, len(SAMPLE) + 1):
            assert read(SAMPLE[:at], SAMPLE[at:end], SAMPLE[end:]) == SAMPLE_EVENTS, (at, end)


def test_random_streams_read_the_same_whole_and_in_random_pieces() -> None:
    pieces = [b"data: a", b"data:", b"event: e", b": c", b"id: 1", b"", b"\r", b"\n", b"\r\n",
              b"x", b"[DONE]"]
    rng = random.Random(7)
    for _ in range(2000):
        stream = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 30)))
        cuts = sorted(rng.sample(range(len(stream) + 1), k=min(3, len(stream) + 1)))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert read(*chunks) == read(stream) == reference(stream), stream


def reference(stream: bytes) -> list[Event]:
    """The format's rules written the slow, obvious way: the whole body at once."""
    events, data, name = [], [], None
    lines = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    for line in [*lines, b""]:
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if not line:
            if data:
                events.append(Event(b"\n".join(data), name))
            data, name = [], None
        elif field == b"data":
            data.append(value)
        elif field == b"event":
            name = value or None
    return events


def test_byte_by_byte_gives_the_same_events() -> None:
    assert read(*(SAMPLE[i:i + 1] for i in range(len(SAMPLE)))) == SAMPLE_EVENTS


@pytest.mark.parametrize(("chunks", "events"), [
    pytest.param([b"data: x\r", b"\n"], [], id="CR then LF: one line end"),
    pytest.param([b"data: x\r", b"\r\n"], [Event(b"x")], id="CR then CRLF: a blank line"),
    pytest.param([b"data: x\r", b"", b"\n"], [], id="an empty chunk between"),
    pytest.param([b"data: x\n\r", b"\n"], [Event(b"x")], id="blank line split in its CRLF"),
    pytest.param([b"data: x\r", b"\ndata: y\r", b"\n\r", b"\n"], [Event(b"x\ny")],
                 id="two splits"),
])
def test_a_cr_ending_a_chunk_pairs_with_an_lf_opening_the_next(
        chunks: list[bytes], events: list[Event]) -> None:
    assert read(*chunks, flush=False) == events


def test_an_event_is_given_once_its_blank_line_came() -> None:
    reader = Reader()
    assert reader.feed(b"data: x\n") == []
    assert reader.feed(b"\n") == [Event(b"x")]
    assert reader.feed(b"data: y") == [] and reader.feed(b"\n\n") == [Event(b"y")]


@pytest.mark.parametrize(("stream", "events"), [
    pytest.param(b"data: x\n", [Event(b"x")], id="no blank line"),
    pytest.param(b"data: x", [Event(b"x")], id="no line end"),
    pytest.param(b"data: x\r", [Event(b"x")], id="a CR at the end"),
    pytest.param(b"data: x\n\ndata: y", [Event(b"x"), Event(b"y")], id="after a whole one"),
    pytest.param(b"event: e\n", [], id="no data"),
    pytest.param(b"", [], id="nothing"),
])
def test_flush_gives_the_event_the_body_ended_in(stream: bytes, events: list[Event]) -> None:
    assert read(stream) == events


def test_after_flush_the_reader_reads_a_new_body() -> None:
    reader = Reader()
    assert reader.feed(b"event: e\ndata: x") == [] and reader.flush() == [Event(b"x", b"e")]
    assert reader.flush() == []
    assert reader.feed(b"data: y\n\n") == [Event(b"y")]


@pytest.mark.parametrize(("stream", "garbage"), [
    (b"data: x\n\n: c\nevent: e\nid: 1\nretry: 2\ndata\nevent\nid\nretry\n\n", False),
    (b"<html><body>Bad Gateway</body></html>\n", True),
    (b'{"error": {"message": "no"}}', True),  # judged at flush, as a last line
    (b"error: {}\n\n", True),
    (b"Data: x\n\n", True),
    (b" data: x\n\n", True),
])
def test_garbage_is_a_line_that_is_no_field_of_the_format(stream: bytes,
                                                          garbage: bool) -> None:
    reader = Reader()
    reader.feed(stream)
    reader.flush()
    assert reader.garbage is garbage


def test_a_line_past_max_line_is_garbage_and_dropped_however_it_comes() -> None:
    long = b"data: " + b"x" * 20
    stream = long + b"\ndata: ok\n\n"
    for at in range(len(stream) + 1):
        reader = Reader(max_line=16)
        events = reader.feed(stream[:at]) + reader.feed(stream[at:])
        assert events == [Event(b"ok")] and reader.garbage, at
    trickled = Reader(max_line=16)
    assert [e for i in range(len(stream)) for e in trickled.feed(stream[i:i + 1])] == [
        Event(b"ok")]
    assert trickled.garbage


def test_a_line_of_max_line_is_read() -> None:
    reader = Reader(max_line=8)
    assert reader.feed(b"data: 12") == [] and reader.feed(b"\n\n") == [Event(b"12")]
    assert not reader.garbage


def test_the_partial_line_kept_is_bounded() -> None:
    reader = Reader(max_line=100)
    for _ in range(1000):
        reader.feed(b"x" * 50)
    assert reader.garbage and len(reader._partial) <= 100
    assert reader.feed(b"\ndata: back\n\n") == [Event(b"back")]


@pytest.mark.parametrize(("data", "name", "written"), [
    (b"{}", None, b"data: {}\n\n"),
    (b"{}", b"message_stop", b"event: message_stop\ndata: {}\n\n"),
    (b"a\nb", None, b"data: a\ndata: b\n\n"),
    (b"a\r\nb\rc\n", None, b"data: a\ndata: b\ndata: c\ndata: \n\n"),
    (b"", None, b"data: \n\n"),
    (DONE, None, b"data: [DONE]\n\n"),
])
def test_encode_writes_what_the_reader_reads_back(data: bytes, name: bytes | None,
                                                  written: bytes) -> None:
    assert encode(data, name) == written
    if b"\r" not in data:
        assert read(written) == [Event(data, name)]


def test_an_event_name_is_one_line() -> None:
    with pytest.raises(ValueError):
        encode(b"{}", b"a\nb")


def usage_only(data: bytes) -> bool:
    return b'"choices":[]' in data


USAGE = b'data: {"choices":[],"usage":{}}'


@pytest.mark.parametrize(("chunk", "kept"), [
    pytest.param(b'data: {"choices":[1]}\n\n' + USAGE + b"\n\ndata: [DONE]\n\n",
                 b'data: {"choices":[1]}\n\ndata: [DONE]\n\n', id="between two events"),
    pytest.param(USAGE + b"\n\n", b"", id="alone"),
    pytest.param(USAGE + b"\r\n\r\ndata: [DONE]\r\n\r\n", b"data: [DONE]\r\n\r\n", id="CRLF"),
    pytest.param(b"data: a\n\n" + USAGE, b"data: a\n\n", id="unterminated, at the end"),
    pytest.param(b"data: a\n\n" + USAGE + b"\n", b"data: a\n\n", id="its blank line to come"),
    pytest.param(b"\n" + USAGE + b"\n\n", b"\n", id="a blank line ending the chunk before"),
    pytest.param(b"event: usage\n" + USAGE + b"\n\n", b"", id="named"),
    pytest.param(b": c\n" + USAGE + b"\n\n", b"", id="with a comment"),
    pytest.param(b"data: a\n\n\n\n" + USAGE + b"\n\n\n", b"data: a\n\n\n\n\n",
                 id="extra blank lines kept"),
])
def test_drop_events_removes_whole_events_and_keeps_every_other_byte(chunk: bytes,
                                                                      kept: bytes) -> None:
    assert drop_events(chunk, usage_only) == kept


@pytest.mark.parametrize("chunk", [
    pytest.param(b'data: {"choices":[1]}\n\ndata: [DONE]\n\n', id="nothing unwanted"),
    pytest.param(b'ices":[],"usage":{}}\n\n', id="the end of a line begun before"),
    pytest.param(b'junk\n' + USAGE + b"\n\n", id="mixed with garbage"),
    pytest.param(b": " + USAGE + b"\n\n", id="a comment"),
    pytest.param(b"", id="empty"),
])
def test_drop_events_returns_the_chunk_itself_when_it_drops_nothing(chunk: bytes) -> None:
    assert drop_events(chunk, usage_only) is chunk


@pytest.mark.parametrize("complete", [
    b'data: {"a": 1}\n\n',
    b'data: {"a": 1}\n\ndata: [DONE]\n\n',
    b': ping\n\ndata: {"a": 1}\n\n',
    b'data: {"a":\ndata: 1}\n\n',
    b'event: x\r\ndata: 2\r\n\r\n',
    b'data:{"a": 1}\n\n',
])
def test_data_of_complete_events_is_what_the_reader_reads(complete: bytes) -> None:
    assert data_of(complete) == [e.data for e in Reader().feed(complete)]


def test_data_reads_what_feed_reads_however_the_bytes_come() -> None:
    """`Reader.data`, which splits whole `data: ` events at once, against `feed`, with chunks
    that are such events and chunks that are not (a BOM, a CR, a name, a held line)."""
    pieces = [b"data: a\n\n", b'data: {"b": 2}\n\n', b"data: \n\n", b"data: [DONE]\n\n",
              b"data: x", b"\n", b"\n\n", b"data:", b"event: e\n", b": c\n\n", b"\r\n",
              b"\xef\xbb\xbf", b"data: a\n\ndata: b\n\n"]
    rng = random.Random(11)
    for _ in range(3000):
        stream = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 20)))
        cuts = sorted(rng.sample(range(len(stream) + 1), k=min(rng.randrange(4), len(stream))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        fed, split = Reader(), Reader()
        expected = [event.data for chunk in chunks for event in fed.feed(chunk)]
        assert [data for chunk in chunks for data in split.data(chunk)] == expected, chunks
        assert split.flush() == fed.flush() and split.garbage == fed.garbage, chunks
    whole = b"data: a\n\ndata: b\n\n"
    assert Reader(max_line=8).data(whole) == [e.data for e in Reader(max_line=8).feed(whole)]
