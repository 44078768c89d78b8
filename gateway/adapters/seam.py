"""The seam of a resumed chat stream, pure: what was sent, how to ask for the rest, and how the
rest is joined on.

`Stitched` watches every event a client is sent: the text so far, whether a tool call started,
whether the answer finished, the first stream's identity (`id`, `created`, `model`). When a
stream breaks, `continuation()` builds the request that asks another candidate for the rest, in
that candidate's dialect (`Provider.continues`), and `Stitched.take()` rewrites the
continuation's events into the first stream's: its identity, no second `role`, the overlap with
the text already sent trimmed, the usage of the whole answer, `: resumed` before the last event.
No I/O here: `gateway.adapters.resume` does the reading and the trying.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from providers.contract.redact import mask_credentials
from providers.contract.stream import MAX_EVENT_TEXT
from providers.contract.usage import Usage
from providers.wire import sse

# What a candidate that cannot be given a prefill is asked, after the partial answer.
INSTRUCTION = ("Your previous message was cut off. Continue it exactly where it stopped, "
               "without repeating any of it and without any preamble.")
RESUMED = b": resumed\n\n"
# Characters of a continuation held at the seam before its overlap with what was sent is
# judged: a model asked in words often repeats the last few words before going on.
ALIGN_CHARS = 64
# An overlap shorter than this is kept (a continuation may well start with the letters the
# answer ended with); whitespace the prefill dropped is always trimmed.
MIN_OVERLAP = 8
_IDENTITY = ("id", "created", "model", "system_fingerprint")
# The most text kept to prefill a continuation with (more than any model writes in one answer):
# past it the answer is relayed as without resume, and a break ends it in-band.
MAX_PARTIAL_CHARS = 2_000_000


class Broke(Exception):
    """The stream being read broke before it finished; `reason` says how, `malformed` that
    what came was no answer chunk (a failover's `bad_response`)."""

    def __init__(self, reason: str, malformed: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.malformed = malformed


class _Delta(msgspec.Struct):
    content: str | None = None
    tool_calls: msgspec.Raw = msgspec.Raw()
    function_call: msgspec.Raw = msgspec.Raw()


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    """What the seam reads of a chat chunk; the rest of the event is relayed as it came."""

    id: str | None = None
    created: int | None = None
    model: str | None = None
    system_fingerprint: str | None = None
    choices: list[_Choice] | None = None
    usage: Usage | None = None
    error: msgspec.Raw = msgspec.Raw()
    object: str | None = None


_CHUNKS = msgspec.json.Decoder(_Chunk)


def continuation(body: dict[str, Any], partial: str, dialect: str, tokens_sent: int
                 ) -> dict[str, Any]:
    """The chat body asking for the rest of `partial` in `dialect`:

    - `prefill` (Anthropic, Ollama): the partial answer as the last, assistant,
      message, which the model goes on from (trailing whitespace dropped: Anthropic refuses it);
    - `continue_final_message` (vLLM, SGLang): the same, with the chat template told to leave
      that message open (`add_generation_prompt: false`);
    - `instruction` (any other): the partial answer, then a user turn asking for the rest.

    The output budget the client asked for shrinks by what was already sent."""
    messages = list(body.get("messages") or ())
    out = {**body, "messages": messages}
    out.pop("n", None)
    if not partial.strip():  # nothing worth continuing was sent: the request again
        return out
    if dialect == "prefill":
        messages.append({"role": "assistant", "content": partial.rstrip()})
    elif dialect == "continue_final_message":
        messages.append({"role": "assistant", "content": partial})
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    else:
        messages += [{"role": "assistant", "content": partial},
                     {"role": "user", "content": INSTRUCTION}]
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(asked := out.get(name), int):
            out[name] = max(1, asked - tokens_sent)
    return out


def overlap(sent: str, incoming: str, dropped: str = "") -> int:
    """How many leading characters of `incoming` repeat the end of `sent`: the whitespace a
    prefill dropped (`dropped`), or a repeat of at least `MIN_OVERLAP` characters."""
    if dropped and incoming.startswith(dropped):
        return len(dropped)
    for size in range(min(len(sent), len(incoming)), MIN_OVERLAP - 1, -1):
        if sent.endswith(incoming[:size]):
            return size
    return 0


def whole_usage(first: Usage | None, first_tokens: int, rest: Usage) -> dict[str, int]:
    """The usage of the whole answer: the prompt once (the first stream's, or the
    continuation's less the partial answer it was given), completion tokens summed."""
    sent = first.completion_tokens if first is not None else first_tokens
    prompt = first.prompt_tokens if first is not None and first.prompt_tokens \
        else max(0, rest.prompt_tokens - sent)
    completion = sent + rest.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


@dataclass(slots=True)
class Stitched:
    """A chat answer as its client has been sent it, across every stream it was read from."""

    identity: dict[str, Any] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)
    passed: int = 0  # data events the client was sent: none, and a break is a failover
    tokens: int = 0  # content events sent: the first part's completion tokens, if unreported
    usage: Usage | None = None  # the last usage an upstream reported, as the client got it
    first_usage: Usage | None = None  # what the current stream's predecessors reported
    own_usage: Usage | None = None  # the continuation being read's usage, as its upstream said
    tool_started: bool = False
    chars: int = 0  # of content kept in `texts`
    overflowed: bool = False  # more than MAX_PARTIAL_CHARS: not resumable, no longer kept
    finished: bool = False
    done: bool = False
    resumes: int = 0
    marked: bool = False  # `: resumed` was sent
    # The seam being aligned: continuation events held, and their text.
    _held: list[dict[str, Any]] = field(default_factory=list)
    _held_text: int = 0
    _aligning: bool = False
    _dropped: str = ""
    _tokens_before: int = 0  # content events sent before the continuation being read

    @property
    def continued_tokens(self) -> int:
        """Content events the continuation being read has sent."""
        return self.tokens - self._tokens_before

    @property
    def text(self) -> str:
        """Every piece of content sent so far."""
        return "".join(self.texts)

    def resumed(self, dropped: str) -> None:
        """A continuation is about to be read; `dropped` is what its prefill left out."""
        self.resumes += 1
        self.first_usage = self.usage
        self.own_usage = None
        self._tokens_before = self.tokens
        self._held, self._held_text, self._aligning = [], 0, True
        self._dropped = dropped

    def take(self, complete: bytes) -> tuple[bytes, Broke | None]:
        """Complete events (`sse.Framer`) in; out, what the client is sent of them, and how
        the stream broke at one of them (None: it did not), which is not sent."""
        if not self.resumes:  # the first stream's bytes go as they came, read by one reader
            read = 0
            try:
                for data in sse.data_of(complete):
                    self._first(data)
                    read += 1
            except Broke as broke:
                self.passed += read
                return _before(complete, read), broke
            self.passed += read
            return complete, None
        out: list[bytes] = []
        for raw in sse.split(complete):
            try:
                out.append(self._rewritten(raw))
            except Broke as broke:
                return b"".join(out), broke
        return b"".join(out), None

    def end(self) -> bytes:
        """The stream's body ended: what was held, and `: resumed` if not yet sent."""
        out = self._align() if self._aligning else b""
        if self.resumes and not self.marked:
            self.marked = True
            out += RESUMED
        return out

    def _first(self, data: bytes) -> None:
        chunk = self._read(data)
        if chunk is not None:
            if not self.identity:  # the first chunk's: every continuation wears it
                self.identity = {name: value for name in _IDENTITY
                                 if (value := getattr(chunk, name, None)) is not None}
            self._count(chunk)

    def _read(self, data: bytes) -> _Chunk | None:
        """The chunk an event carries (None for `[DONE]`); `Broke` for a broken one."""
        if data == sse.DONE:
            self.done = True
            return None
        try:
            chunk = _CHUNKS.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            raise Broke("stream event is not a JSON answer chunk", malformed=True) from None
        if len(chunk.error) or chunk.object == "error":
            # It may echo the request's headers: masked before it goes anywhere.
            said = mask_credentials(data[:MAX_EVENT_TEXT].decode("utf-8", "replace"))
            raise Broke(f"upstream error event: {said[:300]}")
        return chunk

    def _count(self, chunk: _Chunk) -> None:
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices or ():
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self._keep(delta.content)
                    self.tokens += 1
                if len(delta.tool_calls) or len(delta.function_call):
                    self.tool_started = True
            if choice.finish_reason is not None:
                self.finished = True

    def _keep(self, content: str) -> None:
        """Content sent: kept for a continuation's prefill, up to MAX_PARTIAL_CHARS."""
        if self.overflowed:
            return
        self.chars += len(content)
        if self.chars > MAX_PARTIAL_CHARS:
            self.overflowed, self.texts = True, []
            return
        self.texts.append(content)

    def _rewritten(self, raw: bytes) -> bytes:
        event = sse.parse(raw)
        if event is None:
            return b""  # a continuation's comments are its own
        chunk = self._read(event.data)
        if chunk is None:  # [DONE]: the last event
            out = self._align() if self._aligning else b""
            self.marked = True
            return out + RESUMED + raw
        body = msgspec.json.decode(event.data)
        body.update(self.identity)
        if chunk.usage is not None:
            self.own_usage = chunk.usage
            body["usage"] = whole_usage(self.first_usage, self._tokens_before, chunk.usage)
            chunk.usage = msgspec.convert(body["usage"], Usage)
        for choice in body.get("choices") or ():
            if isinstance(delta := choice.get("delta"), dict):
                delta.pop("role", None)  # the answer's one role came with its first event
        if self._aligning:
            self._held.append(body)
            self._held_text += len(_content(body))
            if self._held_text < ALIGN_CHARS and not _ends(body):
                return b""
            return self._align()
        return self._sent(body)

    def _align(self) -> bytes:
        """Drop the overlap from the held events, send them, and stop holding."""
        self._aligning = False
        held, self._held = self._held, []
        cut = overlap(self.text, "".join(_content(b) for b in held), self._dropped)
        out = b""
        for body in held:
            if cut and (text := _content(body)):
                kept = text[cut:]
                cut -= len(text) - len(kept)
                body["choices"][0]["delta"]["content"] = kept
            if not _content(body) and _empty(body):
                continue  # a role, or text that was all overlap
            out += self._sent(body)
        return out

    def _sent(self, body: dict[str, Any]) -> bytes:
        self.passed += 1
        payload = msgspec.json.encode(body)
        self._count(_CHUNKS.decode(payload))
        return sse.encode(payload)


def _before(complete: bytes, events: int) -> bytes:
    """The bytes of `complete` up to the end of its first `events` data events (the rare path
    of a break: the common one never splits what it passes)."""
    kept, seen = [], 0
    for raw in sse.split(complete):
        if seen == events:
            break
        kept.append(raw)
        seen += sse.parse(raw) is not None
    return b"".join(kept)


def _content(body: dict[str, Any]) -> str:
    choices = body.get("choices") or ()
    delta = choices[0].get("delta") if choices else None
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def _ends(body: dict[str, Any]) -> bool:
    """An event that is not text: a finish, a tool call, usage; the seam is judged before it."""
    choices = body.get("choices") or ()
    if not choices:
        return True
    delta = choices[0].get("delta") or {}
    return choices[0].get("finish_reason") is not None or any(
        k != "content" for k, v in delta.items() if v)


def _empty(body: dict[str, Any]) -> bool:
    """A chunk that, its text trimmed away, says nothing."""
    choices = body.get("choices") or ()
    if not choices:
        return not body.get("usage")
    choice, usage = choices[0], body.get("usage")
    delta = choice.get("delta") or {}
    return choice.get("finish_reason") is None and not usage and not any(
        v for k, v in delta.items() if k != "content")
