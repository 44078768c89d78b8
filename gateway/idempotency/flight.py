"""`Idempotency-Key`: a client's retry is answered by the request it repeats, never run twice.

A request carrying the header (on an endpoint that generates) is scoped to its client key and
endpoint (`gateway.idempotency.store.key_of`) and runs as a `Flight`: a task of its own, not the
client's, so the answer is finished and remembered even when the client that asked has left (the
very moment its SDK retries). Every client of the key follows the flight, the first one included:

- a retry while the flight runs joins it: a whole answer waits for the same result; a stream gets
  what was sent so far at once, then follows live;
- a retry after it completed is replayed from the store (`gateway.idempotency.store`), the same
  bytes, with `x-llms-idempotent-replay: true`;
- a joined or replayed request calls no upstream and its record carries no usage nor cost
  (`Record.replayed`): listeners count the first request's usage once.

The same key with another body is a 422 naming the header. Failures are not remembered: an error
answer, a stream ended by an in-band error. A retry after one runs again; a retry that joined a
flight that failed gets the same failure. With Redis, a flight holds a claim on its key
(`gateway.idempotency.claims`): a retry that reaches another replica while the first still runs
waits there for its answer and is replayed (a stream whole, once it ended), never run again; a
retry after it completed is replayed on any replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from gateway.core import endpoints
from gateway.core.call import ClientDisconnected, Watching
from gateway.core.delivery import Streamed, Whole, kept_stream
from gateway.core.errors import IdempotencyKeyBusy, IdempotencyKeyReused
from gateway.core.record import Outcome, Record
from gateway.core.settings import IdempotencyConfig
from gateway.idempotency.claims import Claim, pause
from gateway.idempotency.store import IdempotencyStore, Remembered, digest_of, key_of
from providers.contract.errors import GatewayError, InvalidRequest
from providers.contract.log import get_logger
from providers.contract.stream import close_quietly

HEADER = "idempotency-key"
REPLAY_HEADER = "x-llms-idempotent-replay"
PARAM = "Idempotency-Key"
MAX_KEY_CHARS = 255
ENDPOINTS = endpoints.GENERATING
# What a flight's answer says of the request that ran it, not of a retry that follows it.
_OWN_HEADERS = frozenset({"x-request-id", "x-llms-cost", "x-llms-attempts"})

Produce = Callable[[], Awaitable[Whole | Streamed | None]]
FIRST_PAUSE = 0.02  # the first look again at another replica's answer


@dataclass(slots=True, eq=False)  # each follower is itself, whatever its place
class _Reader:
    """Where one follower of a stream is: the index of the next chunk it reads."""

    at: int = 0


class Flight:
    """One keyed request running in this process: its answer as it comes, for every follower.

    `opened` is set once the answer is known to be whole (`whole`, complete) or a stream
    (`stream`, its chunks in `chunks` as they come, `ended` at its end). A stream's chunks are
    held for joiners up to the store's bound; past it the flight is no longer `joinable` and
    holds only what its followers have yet to read."""

    def __init__(self, digest: str, limit: int) -> None:
        self.digest = digest
        self.limit = limit
        self.opened = asyncio.Event()
        self.whole: Whole | None = None
        self.stream: Streamed | None = None
        self.chunks: list[bytes] = []
        self.base = 0  # the index of chunks[0] among all the stream's chunks
        self.size = 0
        self.joinable = True
        self.ended = False
        # Its client left: the flight holds a slot of its own, given back by this at its end.
        self.release: Callable[[], None] | None = None
        self.waiters = 0
        # The client that started it reads from the start: counted before any chunk comes.
        self.first = _Reader()
        self.readers: set[_Reader] = {self.first}
        self._wake = asyncio.Event()

    def publish(self, chunk: bytes) -> None:
        """A chunk the stream sent: every follower is woken for it."""
        self.chunks.append(chunk)
        self.size += len(chunk)
        if self.size > self.limit:
            self.joinable = False  # too large to remember: nor kept whole for joiners
        if not self.joinable:
            low = min((r.at for r in self.readers), default=self.base + len(self.chunks))
            del self.chunks[:low - self.base]
            self.base = low
        self._wakeup()

    def end(self) -> None:
        """The answer is over (or never came): followers stop once they have read it all."""
        self.ended = True
        self.opened.set()
        self._wakeup()

    def _wakeup(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def follow(self, reader: _Reader | None = None) -> AsyncGenerator[bytes, None]:
        """The stream from its start (a flight still joinable holds every chunk): what is
        held at once, in one write, then each chunk as it comes. The follower counts from
        now, so nothing it has yet to read is let go."""
        if reader is None:
            reader = _Reader(self.base)
            self.readers.add(reader)
        return self._tail(reader)

    async def _tail(self, reader: _Reader) -> AsyncGenerator[bytes, None]:
        try:
            while True:
                wake = self._wake
                if (start := max(0, reader.at - self.base)) < len(self.chunks):
                    pending = self.chunks[start:]
                    reader.at += len(pending)
                    yield b"".join(pending)
                elif self.ended:
                    return
                else:
                    await wake.wait()
        finally:
            self.readers.discard(reader)


class Idempotency:
    """The keyed requests of this process: those running (`Flight`s) and the store of those
    that completed."""

    def __init__(self, store: IdempotencyStore,
                 hold: Callable[[], Callable[[], None]] = lambda: lambda: None) -> None:
        self.store = store
        self.running: dict[str, Flight] = {}
        # A slot under `server.max_concurrency` taken at once (`Runtime.hold`), and what gives
        # it back: a flight whose client left still calls an upstream, so it keeps counting.
        self.hold = hold
        self._tasks: set[asyncio.Task[None]] = set()

    def launch(self, key: str, flight: Flight, produce: Produce, ttl: float,
               claim: Claim) -> None:
        """Run `flight` in a task of its own, held here (and claimed) until it ends."""
        self.running[key] = flight
        task = asyncio.create_task(_fly(self, key, flight, produce, ttl, claim))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def detach(self, flight: Flight) -> None:
        """The client that started `flight` left before its end: the slot it gave back is
        taken again, until the flight ends (`_fly`)."""
        if not flight.ended and flight.release is None:
            flight.release = self.hold()

    async def close(self) -> None:
        """Stop the flights still running (the process is stopping)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def keyed(headers: Mapping[str, str], record: Record) -> str | None:
    """The request's `Idempotency-Key`, None when it has none or its endpoint does not
    generate; a 400 naming the header when the value is unusable."""
    sent = headers.get(HEADER)
    if sent is None or record.endpoint not in ENDPOINTS:
        return None
    if not sent or len(sent) > MAX_KEY_CHARS or not sent.isascii() or not sent.isprintable():
        raise InvalidRequest(f"{PARAM} must be 1 to {MAX_KEY_CHARS} printable ASCII "
                             "characters", param=PARAM)
    return sent


async def answer(keys: Idempotency, sent: str, body: bytes, record: Record,
                 config: IdempotencyConfig, watching: Watching, produce: Produce
                 ) -> Whole | Streamed | None:
    """The answer to a keyed request: replayed, joined, or produced by a new flight (`produce`
    runs the rest of the stages, which no client's leaving cancels); None when the client left
    (`watching`). A `GatewayError` when the key cannot serve this request."""
    key, digest = key_of(record.key_id, record.endpoint, sent), digest_of(body)
    flight = keys.running.get(key)
    if flight is None:
        remembered = await keys.store.get(key)
        if remembered is not None:
            _check(remembered.digest, digest)
            return _replayed(remembered, record)
        flight = keys.running.get(key)  # another request may have started it meanwhile
    if flight is not None:
        return await _join(flight, digest, record, config, watching)
    try:
        claim = await _claimed(keys, key, digest, watching)
    except ClientDisconnected:
        record.end(Outcome.CLIENT_LEFT)
        return None
    if isinstance(claim, Remembered):
        _check(claim.digest, digest)
        return _replayed(claim, record)
    if isinstance(claim, Flight):  # started here while this one claimed: followed live
        return await _join(claim, digest, record, config, watching)
    flight = Flight(digest, keys.store.max_entry_bytes)
    keys.launch(key, flight, produce, config.ttl, claim)
    try:
        async with watching():
            await flight.opened.wait()
    except ClientDisconnected:
        flight.readers.discard(flight.first)
        keys.detach(flight)
        return None  # the flight goes on, and ends this request's record
    return _first(keys, flight)


async def _claimed(keys: Idempotency, key: str, digest: str, watching: Watching
                   ) -> Claim | Remembered | Flight:
    """This process's claim on the key; or, while another request holds it, the flight if it
    runs here, else the answer its replica stored once it let go (waited for as long as the
    client stays)."""
    if keys.store.claims.redis is None:  # this process alone runs the key's requests
        return Claim(key)
    waited = FIRST_PAUSE
    async with watching():
        while True:
            taken = await keys.store.claims.take(key, digest)
            if isinstance(taken, Claim):
                break
            if (flight := keys.running.get(key)) is not None:
                return flight
            _check(taken.digest, digest)
            if not taken.joinable:
                raise IdempotencyKeyBusy(f"The request with this {PARAM} is still running on "
                                         "another replica and too large to join; retry once "
                                         "it has finished", param=PARAM)
            waited = await pause(waited)
            if (remembered := await keys.store.get(key)) is not None:
                return remembered
    # Stored between this request's first look and its claim: the claim is not needed.
    if taken.token and (remembered := await keys.store.get(key)) is not None:
        await keys.store.claims.release(taken)
        return remembered
    return taken


def _check(remembered: str, digest: str) -> None:
    if remembered != digest:
        raise IdempotencyKeyReused(f"This {PARAM} was already used with a different request "
                                   "body; use a new key for a new request", param=PARAM)


async def _fly(keys: Idempotency, key: str, flight: Flight, produce: Produce,
               ttl: float, claim: Claim) -> None:
    """Run the request to its end, whoever still follows it, and remember it if it succeeded;
    its claim kept until then."""
    remembered: Remembered | None = None
    claims = keys.store.claims
    kept = asyncio.create_task(claims.keep(claim, flight.digest, lambda: flight.joinable)) \
        if claim.token else None
    try:
        answer = await produce()
        if isinstance(answer, Streamed):
            flight.stream = answer
            flight.opened.set()
            try:
                async for chunk in answer.chunks:
                    flight.publish(chunk)
            finally:
                await close_quietly(answer.chunks)  # this ends its record, usage counted
            record = answer.record
            if record.outcome is Outcome.COMPLETED and flight.joinable:
                remembered = Remembered(flight.digest, keys.store.clock() + ttl, answer.media_type,
                                        b"".join(flight.chunks), True, record.provider,
                                        record.alias)
        elif answer is not None:
            flight.whole = answer
            answer.record.end(answer.outcome)  # its client may be gone: the answer is ready
            if answer.status == 200 and answer.outcome is Outcome.COMPLETED:
                remembered = Remembered(flight.digest, keys.store.clock() + ttl, answer.media_type,
                                        answer.body, False, answer.record.provider,
                                        answer.record.alias)
        flight.end()  # followers have it all; a retry finds it running until it is stored
        if remembered is not None:
            await keys.store.put(key, remembered)
    except Exception:  # a bug: followers end as the flight does; logged with its traceback
        get_logger().exception("idempotent_request_failed")
    finally:
        if kept is not None:
            kept.cancel()
        flight.end()
        if keys.running.get(key) is flight:
            del keys.running[key]
        if flight.release is not None:
            flight.release()
        await claims.release(claim)  # after the answer is stored: a replica waiting reads it


def _first(keys: Idempotency, flight: Flight) -> Whole | Streamed:
    """The flight's answer for the client that started it: as the pipeline made it."""
    if flight.stream is not None:
        stream = flight.stream
        return Streamed(_started(flight.follow(flight.first), keys, flight), stream.headers,
                        stream.record, stream.status, stream.media_type)
    if flight.whole is None:
        raise GatewayError("Internal gateway error")
    return flight.whole


async def _join(flight: Flight, digest: str, record: Record, config: IdempotencyConfig,
                watching: Watching) -> Whole | Streamed | None:
    """A retry of a running request: its answer, whole once it is, or streamed from its
    first chunk."""
    _check(flight.digest, digest)
    if not flight.joinable:
        raise IdempotencyKeyBusy(f"The request with this {PARAM} is still running and too "
                                 "large to join; retry once it has finished", param=PARAM)
    if flight.waiters >= config.max_waiters:
        raise IdempotencyKeyBusy(f"Too many retries wait on the request with this {PARAM}; "
                                 "retry shortly", param=PARAM)
    flight.waiters += 1  # until its answer is whole, or its stream over (`_followed`)
    try:
        async with watching():
            await flight.opened.wait()
    except ClientDisconnected:
        flight.waiters -= 1
        record.end(Outcome.CLIENT_LEFT)
        return None
    if flight.stream is not None:
        stream = flight.stream
        _follows(record, stream.record)
        record.first_token()
        return Streamed(_followed(flight.follow(), flight, record),
                        _headers(stream.headers, record), record, stream.status,
                        stream.media_type)
    flight.waiters -= 1
    whole = flight.whole
    if whole is None:
        raise GatewayError("Internal gateway error")
    _follows(record, whole.record)
    record.status, record.error_code = whole.status, whole.record.error_code
    return Whole(whole.body, _headers(whole.headers, record), record, whole.status,
                 whole.media_type, whole.outcome)


async def _started(chunks: AsyncGenerator[bytes, None], keys: Idempotency, flight: Flight
                   ) -> AsyncGenerator[bytes, None]:
    """The stream for the client that started it; if it leaves first, the flight goes on."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await close_quietly(chunks)
        keys.detach(flight)


def _follows(record: Record, first: Record) -> None:
    """`record` is answered by `first`'s answer: who served it, nothing used of its own."""
    record.replayed = True
    record.mark(REPLAY_HEADER, "true")
    record.provider, record.alias, record.failed = first.provider, first.alias, ()


def _headers(first: Mapping[str, str], record: Record) -> dict[str, str]:
    """The first request's answer headers, with this request's own."""
    kept = {name: value for name, value in first.items() if name.lower() not in _OWN_HEADERS}
    return {**kept, **record.headers()}


async def _followed(chunks: AsyncGenerator[bytes, None], flight: Flight, record: Record
                    ) -> AsyncGenerator[bytes, None]:
    """A joiner's stream, its own record ended as the stream ended for it."""
    outcome = Outcome.CLIENT_LEFT
    try:
        async for chunk in chunks:
            yield chunk
        first = flight.stream.record.outcome if flight.stream is not None else None
        outcome = Outcome.COMPLETED if first is Outcome.COMPLETED else Outcome.ERROR
    finally:
        flight.waiters -= 1
        await close_quietly(chunks)
        record.end(outcome)


def _replayed(remembered: Remembered, record: Record) -> Whole | Streamed:
    """A completed request's answer, again, for its retry."""
    record.replayed = True
    record.mark(REPLAY_HEADER, "true")
    record.provider, record.alias = remembered.provider, remembered.alias or record.alias
    if not remembered.stream:
        return Whole(remembered.body, record.headers(), record,
                     media_type=remembered.media_type)
    return kept_stream(remembered.body, record, media_type=remembered.media_type)

