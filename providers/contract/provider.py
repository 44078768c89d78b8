"""What every provider kind implements: send one request, or stream one.

A kind turns the gateway's `Outgoing` request into its upstream's wire format and the answer back
into OpenAI's, over the process's one `Transport`. Failures are raised as
`providers.contract.errors` types, so the router can decide failover without knowing which kind
it talked to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import msgspec

from providers.contract import form
from providers.contract.errors import InvalidRequest, ProviderRejected
from providers.contract.lasting import Lasting
from providers.contract.numbers import check_numbers
from providers.contract.spec import ProviderSpec
from providers.contract.stream import Opened, peek
from providers.contract.transport import Transport, UpstreamSocket
from providers.contract.usage import Usage


class Resumes(msgspec.Struct):  # a Struct: every request makes one
    """What resuming a request's broken streams came to (`gateway.adapters.resume`): one
    client request's, shared by every request derived from it, read by its record."""

    ok: int = 0  # continuations that were spliced in and went on
    failed: int = 0  # resumes that found no candidate to continue, or broke with none left
    by: str | None = None  # the provider whose continuation was spliced in last
    # Dollars the continuations are billed beyond the answer's usage as the client sees it (a
    # continuation's prompt is the request again with the partial answer): charged too.
    billed: float = 0.0


@dataclass(slots=True)
class Outgoing:
    """A client request on its way to one provider: the raw body, and what the gateway parsed."""

    endpoint: str  # "chat/completions", "embeddings", "messages", "audio/speech", ...
    raw: bytes
    model: str
    stream: bool
    request_id: str
    client_wants_usage: bool = False  # the client asked for stream usage itself
    key_id: str | None = None  # the gateway key that sent it, when keys are configured
    choices: int = 1  # the request's `n`: a stream is finished once that many have ended
    # The client's `anthropic-beta` header: the betas that make its Messages body valid.
    betas: str | None = None
    resumes: Resumes = field(default_factory=Resumes)
    # Its priority in the gateway's queue (`x-llms-priority`, higher first): a provider with a
    # line of its own (the bundled pool, vLLM's scheduler) orders it the same way.
    priority: int = 0
    # A body that is not JSON (a multipart upload: `providers.contract.form`), its
    # Content-Type with the boundary; None for JSON.
    content_type: str | None = None
    _json: dict[str, Any] | None = None

    def json(self) -> dict[str, Any]:
        """The body as a dict, decoded once; callers copy before changing it. An upload's
        are its text fields."""
        if self._json is None:
            self._json = decode_body(self.raw) if self.content_type is None \
                else dict(form.fields(self.raw, self.content_type))
        return self._json

    def fields(self) -> dict[str, Any]:
        """The body's top-level fields in a fresh dict, to change and encode again: decoded
        when the body was decoded already, else each value as the bytes it came as
        (`msgspec.Raw`, encoded back as it is: the gateway checked the body when it came)."""
        if self._json is not None:
            return dict(self._json)
        try:
            return _TOP_LEVEL.decode(self.raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return dict(self.json())  # not a JSON object: its decode says what is wrong

    def renamed(self, model: str) -> Outgoing:
        """The same request naming `model`, in its body too (an upload's `model` field
        rewritten in place, the rest of its bytes as they came)."""
        if self.content_type is not None:
            raw = form.with_field(self.raw, self.content_type, "model", model)
            return replace(self, raw=raw, model=model, _json=None)
        body = {**self.json(), "model": model}
        return replace(self, raw=msgspec.json.encode(body), model=model, _json=body)

    def asking(self, stream: bool) -> Outgoing:
        """The same request asking for a stream, or for the whole answer (a stream's usage is
        asked for by the kind that sends it)."""
        if self._json is not None:
            body = {**self._json, "stream": stream}
        else:  # top-level fields only, the rest as the bytes it came as (`fields`)
            body = self.fields()
            body["stream"] = stream
        body.pop("stream_options", None)
        return Outgoing(self.endpoint, msgspec.json.encode(body), self.model, stream,
                        self.request_id, key_id=self.key_id, choices=self.choices,
                        betas=self.betas, resumes=self.resumes, priority=self.priority,
                        _json=body if self._json is not None else None)

    def with_body(self, endpoint: str, body: dict[str, Any]) -> Outgoing:
        """The same request as another endpoint's body (what a bridge sends on)."""
        return Outgoing(endpoint, msgspec.json.encode(body), self.model, self.stream,
                        self.request_id, client_wants_usage=True, key_id=self.key_id,
                        choices=self.choices, resumes=self.resumes, priority=self.priority)


# A body's top-level fields, their values left as bytes: what changes a field or two decodes
# no more than that.
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])


def decode_body(raw: bytes) -> dict[str, Any]:
    """A client's body, whole, for a kind that translates it. The gateway checked its head;
    a value past what it can hold (an integer past 64 bits in any field) is the client's."""
    try:
        body = msgspec.json.decode(raw)
    except msgspec.ValidationError as exc:
        check_numbers(raw)  # msgspec names no key of an untyped object: find the place
        raise InvalidRequest.from_msgspec(exc) from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"Request body is not UTF-8 (byte {exc.start})") from None
    except RecursionError:  # in a field the gateway's own check skipped
        raise InvalidRequest("Request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request body is not a JSON object")
    return body


class Reply(msgspec.Struct, frozen=True):  # a Struct: made for every whole answer
    """A complete, successful upstream answer, already in OpenAI's format."""

    body: bytes
    content_type: str = "application/json"
    usage: Usage | None = None  # from the answer, when it reports one

    async def close(self) -> None:
        """A whole answer holds nothing open."""


class Gathering:
    """A whole answer whose first token has come and whose rest is still arriving (a stream
    assembled for a client that asked for the whole answer). Not an `ABC`: every whole answer
    is checked against it, and `isinstance` with an ABC runs `ABCMeta.__instancecheck__`."""

    async def reply(self) -> Reply:
        """Read the rest: the whole answer, or a `ProviderError` (still a failover)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Stop reading; the upstream request is closed."""
        raise NotImplementedError


# What one try at a provider gives, once its first token is there: a whole reply, a peeked
# stream to relay, or a whole answer still gathering. A try returns nothing sooner, so whoever
# races tries (hedging) races on these values.
Answer = Reply | Opened | Gathering


class ProviderDisabled(Exception):
    """Raised by `Provider.start()`: this provider cannot serve here (the reason is logged)."""


class Provider(ABC):
    """One configured provider of some kind. Built per config snapshot; the transport is the
    process's, shared by every provider."""

    kind: ClassVar[str]
    #: Endpoints this kind can serve natively.
    endpoints: frozenset[str] = frozenset({"chat/completions", "completions"})
    #: Inputs per embeddings call the upstream takes (None: no limit); `max_embedding_batch`
    #: in llms.json overrides it.
    embedding_batch: ClassVar[int | None] = None
    #: Whether the upstream runs `/v1/files` and `/v1/batches` itself (an `openai` provider
    #: with `"batches": "native"`): a batch for it is relayed there (`batch_api`), not run by
    #: the gateway.
    native_batches: bool = False
    #: Whether that upstream keeps a batch's input file (`POST files`, then `POST batches`
    #: naming it, as OpenAI's); when not (Anthropic's message batches), the gateway keeps the
    #: file and `POST batches` carries its lines (`application/jsonl`).
    batch_files: ClassVar[bool] = True
    #: The kind's own fields in a provider's llms.json object, beyond those every kind shares
    #: (`ProviderEntry`), and in each of its model objects, beyond `ModelEntry`'s: any other
    #: field is a typo, refused at load with the closest known name.
    fields: ClassVar[frozenset[str]] = frozenset()
    model_fields: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        self.spec = spec
        self.name = spec.name
        self.transport = transport

    @abstractmethod
    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        """Send a non-streaming request; raise a ProviderError or UpstreamClientError on failure."""

    @abstractmethod
    def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        """Stream OpenAI-format SSE bytes; failures before the first chunk allow failover."""

    def answer(self, request: Outgoing, upstream_model: str) -> Coroutine[Any, Any, Answer]:
        """One try, to await: a peeked stream for a streamed request, else the whole reply.
        Adapters (`gateway.adapters`) override this; kinds implement `send` and `stream`. Not
        a coroutine itself: it would be one more frame to resume on every upstream read."""
        if request.stream:
            return peek(self.stream(request, upstream_model), request.choices)
        return self.send(request, upstream_model)

    async def batch_api(self, method: str, path: str, body: bytes | None = None,
                        content_type: str = "application/json") -> bytes:
        """A files or batches call in OpenAI's API (`path` under its base URL, e.g.
        `batches/ID`) made to an upstream that runs batches (`native_batches`), translated
        by a kind whose upstream speaks another: its whole 2xx answer, as OpenAI's."""
        raise NotImplementedError(f"provider type {self.kind!r} does not run batches")

    async def realtime(self, upstream_model: str, beta: bool, max_frame_bytes: int
                       ) -> UpstreamSocket:
        """A Realtime session's upstream WebSocket, its handshake done (`beta`: the client
        speaks the beta protocol, `OpenAI-Beta: realtime=v1`); a kind that has none refuses."""
        raise ProviderRejected(f"provider type {self.kind!r} does not serve the Realtime API")

    async def list_models(self) -> list[str]:
        """The upstream's model ids, for `"models": "*"`; kinds that can list them override."""
        raise NotImplementedError(f"provider type {self.kind!r} cannot list its models")

    async def start(self, lasting: Lasting) -> None:  # noqa: B027 - optional hook
        """Called once before a snapshot using this provider goes live.

        Kinds that own processes keep them in `lasting`, so a reload does not restart them;
        raising `ProviderDisabled` takes the provider out of this snapshot with its reason.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Called when the snapshot is replaced or the gateway stops."""

    def live_state(self) -> dict[str, Any] | None:
        """What this provider is doing now, for /ready and the status page (pools: workers)."""
        return None

    def loading_models(self) -> list[str]:
        """Aliases this provider serves that cannot answer yet (a pool's loading models)."""
        return []

    def supports(self, endpoint: str) -> bool:
        return endpoint in self.endpoints

    def serves(self, endpoint: str, upstream_model: str) -> bool:
        """Whether `upstream_model` here serves `endpoint`: a kind whose models differ (a pool's
        chat and embedding models) answers per model."""
        return self.supports(endpoint)

    def calls_tools(self, upstream_model: str) -> bool:
        """Whether `upstream_model` here answers a request's `tools`; a kind whose engine would
        ignore them says no, so the request goes where they are used, or is refused."""
        return True

    def credentials(self) -> Mapping[str, str]:
        """The headers that carry this provider's credentials, as its kind sends them (for
        `/passthrough`); none for a kind that has none or signs each request."""
        return {}

    def streams_whole_answers(self) -> bool:
        """Whether a whole-answer request may go upstream as a stream, for early failover
        (`stream_upstream`); a kind whose streams lose something (usage) says no."""
        return self.spec.stream_upstream is not False

    def continues(self) -> str:
        """How this provider is asked to go on with a partial chat answer (a resume): a
        trailing assistant message it continues (`prefill`), the same with vLLM's and SGLang's
        `continue_final_message`, or, when it can do neither, an `instruction` in words."""
        return "instruction"

    def takes_cache_control(self, upstream_model: str) -> bool:
        """Whether chat `cache_control` marks reach `upstream_model` as prompt-cache
        breakpoints (Anthropic's models), so a bridge keeps them in the chat it sends; an
        upstream that does not know them may refuse them."""
        return False

    def forwarded_betas(self, request: Outgoing) -> list[str]:
        """The client's betas (`request.betas`) this provider sends upstream with `request`:
        what, beside the body, may change its answer (the response cache's key)."""
        return []

    @property
    def embedding_batch_limit(self) -> int | None:
        """The most inputs one upstream embeddings call may carry."""
        return self.spec.max_embedding_batch or self.embedding_batch


class Adapter(Provider):
    """A provider wrapped to serve what it cannot as it is (an endpoint it does not speak, a
    batch larger than it takes, a whole answer gathered from its stream): the same shape in and
    out, its errors passed through, so the router fails over as for the provider itself."""

    kind = "adapter"

    def __init__(self, inner: Provider) -> None:
        super().__init__(inner.spec, inner.transport)
        self.inner = inner

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        return await self.inner.send(request, upstream_model)

    def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        return self.inner.stream(request, upstream_model)

    def supports(self, endpoint: str) -> bool:
        return endpoint in self.endpoints or self.inner.supports(endpoint)

    def serves(self, endpoint: str, upstream_model: str) -> bool:
        return endpoint in self.endpoints or self.inner.serves(endpoint, upstream_model)

    def calls_tools(self, upstream_model: str) -> bool:
        return self.inner.calls_tools(upstream_model)

    def streams_whole_answers(self) -> bool:
        return self.inner.streams_whole_answers()

    def credentials(self) -> Mapping[str, str]:
        return self.inner.credentials()

    async def realtime(self, upstream_model: str, beta: bool, max_frame_bytes: int
                       ) -> UpstreamSocket:
        return await self.inner.realtime(upstream_model, beta, max_frame_bytes)

    def continues(self) -> str:
        return self.inner.continues()

    def takes_cache_control(self, upstream_model: str) -> bool:
        return self.inner.takes_cache_control(upstream_model)

    def forwarded_betas(self, request: Outgoing) -> list[str]:
        return self.inner.forwarded_betas(request)

    @property
    def embedding_batch_limit(self) -> int | None:
        return self.inner.embedding_batch_limit
