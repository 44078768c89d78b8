"""`"type": "anthropic"`: chat completions translated to Anthropic's Messages API and back.

Translation is pure: the request in `anthropic_request` (`to_messages`), the answer here
(`to_chat_completion`, `StreamTranslator`); the provider only sends. Messages requests (and
their token counts) pass through as the client wrote them.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Literal

import msgspec

from providers.contract.errors import BadUpstreamResponse, NotFound, ProviderUnavailable
from providers.contract.messages import STOP_REASONS, usage_of
from providers.contract.provider import Outgoing, Provider, Reply
from providers.contract.spec import ProviderSpec, betas_in
from providers.contract.stream import event_object
from providers.contract.translate import translated
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds import anthropic_batches as batches
from providers.kinds.anthropic_request import to_messages
from providers.wire import sse
from providers.wire.http import HttpUpstream
from providers.wire.upstream_errors import scrub

API_VERSION = "2023-06-01"
DEFAULT_BASE_URL = "https://api.anthropic.com"


def to_chat_completion(message: Mapping[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat completion for a Messages API answer."""
    text, reasoning, calls = [], [], []
    for block in message.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            text.append(block.get("text", ""))
        elif kind == "thinking":
            reasoning.append(block.get("thinking", ""))
        elif kind == "tool_use":
            calls.append({"id": block.get("id", ""), "type": "function",
                          "function": {"name": block.get("name", ""),
                                       "arguments": json.dumps(block.get("input") or {})}})
    answer: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None,
                              "refusal": None}
    if reasoning:
        answer["reasoning"] = answer["reasoning_content"] = "".join(reasoning)
    if calls:
        answer["tool_calls"] = calls
    return {"id": f"chatcmpl-{message.get('id', '')}", "object": "chat.completion",
            "created": int(time.time()), "model": message.get("model") or model,
            "choices": [{"index": 0, "message": answer, "logprobs": None,
                         "finish_reason": STOP_REASONS.get(message.get("stop_reason") or "",
                                                           "stop")}],
            "usage": usage_of(message.get("usage"))}


class StreamTranslator:
    """Messages API stream events in, OpenAI chat-completion chunks (SSE bytes) out."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = "chatcmpl-anthropic"
        self.created = int(time.time())
        self.blocks: dict[int, tuple[str, int]] = {}  # block index → (kind, tool call index)
        self.calls = 0
        self.usage: dict[str, Any] = {}
        self._reader = sse.Reader()

    def feed(self, chunk: bytes) -> bytes:
        """Chunks for every complete event in `chunk`; raises on an `error` event."""
        return b"".join(self.translate(event.data) for event in self._reader.feed(chunk))

    def close(self) -> bytes:
        """At the upstream's clean end: chunks for a last event it did not end with a blank
        line."""
        return b"".join(self.translate(event.data) for event in self._reader.flush())

    def translate(self, data: bytes) -> bytes:
        """Chunks for one event's JSON (Bedrock delivers the events in its own framing)."""
        if (payload := event_object(data)) is None:
            return b""
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message") or {}
            self.id = f"chatcmpl-{message.get('id', '')}"
            self.usage.update(message.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "content_block_start":
            return self._block_start(payload.get("index", 0), payload.get("content_block") or {})
        if kind == "content_block_delta":
            return self._delta(payload.get("index", 0), payload.get("delta") or {})
        if kind == "message_delta":
            self.usage.update(payload.get("usage") or {})
            reason = (payload.get("delta") or {}).get("stop_reason")
            return self._chunk({}, STOP_REASONS.get(reason or "", "stop")) if reason else b""
        if kind == "message_stop":
            usage = usage_of(self.usage)
            return sse.encode(msgspec.json.encode({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": usage})) + sse.encode(sse.DONE)
        if kind == "error":
            error = payload.get("error") or {}
            said = f"{error.get('type', 'error')}: {error.get('message')}"
            raise ProviderUnavailable(scrub(said))  # it may echo the request's headers
        return b""  # ping, content_block_stop

    def _block_start(self, index: int, block: Mapping[str, Any]) -> bytes:
        kind = block.get("type", "text")
        if kind != "tool_use":
            self.blocks[index] = (kind, -1)
            return b""
        self.blocks[index] = (kind, self.calls)
        self.calls += 1
        call = {"index": self.calls - 1, "id": block.get("id", ""), "type": "function",
                "function": {"name": block.get("name", ""), "arguments": ""}}
        return self._chunk({"tool_calls": [call]})

    def _delta(self, index: int, delta: Mapping[str, Any]) -> bytes:
        kind = delta.get("type")
        if kind == "text_delta":
            return self._chunk({"content": delta.get("text", "")})
        if kind == "thinking_delta":
            thought = delta.get("thinking", "")
            return self._chunk({"reasoning": thought, "reasoning_content": thought})
        if kind == "input_json_delta":
            call = self.blocks.get(index, ("tool_use", 0))[1]
            return self._chunk({"tool_calls": [{"index": call, "function": {
                "arguments": delta.get("partial_json", "")}}]})
        return b""

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse.encode(msgspec.json.encode({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                              "finish_reason": finish}]}))


# Endpoints relayed as they are, and their paths after /v1/messages.
NATIVE = {"messages": "", "messages/count_tokens": "/count_tokens"}


class _Message(msgspec.Struct):
    type: Literal["message"]
    content: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


class _Counted(msgspec.Struct):
    input_tokens: int


def checked_answer(payload: bytes, shape: type[msgspec.Struct]) -> bytes:
    """`payload` if it is a JSON answer of `shape`; a failover if it is not."""
    try:
        msgspec.json.decode(payload, type=shape)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not a Messages answer: {exc}") from None
    return payload


def chat_reply(payload: bytes, upstream_model: str) -> Reply:
    """The chat completion, with its usage, for a whole Messages answer (Anthropic's own, or
    Vertex AI's `rawPredict`)."""
    try:
        message = msgspec.json.decode(payload)
    except msgspec.DecodeError as exc:
        raise ProviderUnavailable(f"response is not JSON: {exc}") from None
    answer = to_chat_completion(message, upstream_model)
    return Reply(msgspec.json.encode(answer), usage=msgspec.convert(answer["usage"], Usage))


class AnthropicProvider(Provider):
    """Anthropic's Messages API behind the OpenAI chat-completions interface."""

    kind = "anthropic"
    # Messages (and their token counts) pass through natively: no double translation.
    endpoints = frozenset({"chat/completions", "messages", "messages/count_tokens"})
    # Message batches carry their requests: the gateway keeps the input file.
    batch_files = False
    fields = frozenset({"batches"})

    def continues(self) -> str:
        """A trailing assistant turn is a prefill the Messages API continues."""
        return "prefill"

    def takes_cache_control(self, upstream_model: str) -> bool:
        return True

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        super().__init__(spec, transport)
        self._url = f"{(spec.base_url or DEFAULT_BASE_URL).removesuffix('/v1')}/v1/messages"
        headers = {"Content-Type": "application/json", "anthropic-version": API_VERSION,
                   **spec.headers}
        secret = spec.api_key.reveal() if spec.api_key else None
        if secret:
            headers["x-api-key"] = secret
        self.http = HttpUpstream(spec.name, spec.timeouts, headers, secret, transport,
                                 spec.link_for(self._url))
        self._beta_header = next((name for name in headers if name.lower() == "anthropic-beta"),
                                 "anthropic-beta")
        self._configured_betas = headers.get(self._beta_header, "")
        if spec.raw.get("batches") not in (None, "native"):
            raise ValueError('batches: must be "native" (Anthropic runs them) or absent')
        self.native_batches = spec.raw.get("batches") == "native"

    def credentials(self) -> Mapping[str, str]:
        return self.http.credentials()

    def _body(self, request: Outgoing, upstream_model: str) -> bytes:
        if request.endpoint in NATIVE:
            return msgspec.json.encode(self._shaped({**request.json(), "model": upstream_model}))
        return msgspec.json.encode(self._params(request.json(), upstream_model))

    def _params(self, chat: Mapping[str, Any], upstream_model: str) -> dict[str, Any]:
        """The Messages body for a chat body, as this provider sends it."""
        return self._shaped(to_messages(chat, upstream_model))

    def _shaped(self, body: dict[str, Any]) -> dict[str, Any]:
        for name in self.spec.drop_params:
            body.pop(name, None)
        body.update(self.spec.params)
        return body

    async def batch_api(self, method: str, path: str, body: bytes | None = None,
                        content_type: str = "application/json") -> bytes:
        """OpenAI's batch calls made on Anthropic's message batches: `POST batches` with the
        input file's lines, `GET batches/ID`, `POST batches/ID/cancel`, and `GET
        files/ID/content` for a batch's output or error file."""
        if not self.native_batches:
            return await super().batch_api(method, path, body, content_type)
        parts = path.split("/")
        if method == "GET" and parts[0] == "files" and parts[2:] == ["content"] \
                and (named := batches.FILE_ID.fullmatch(parts[1])):
            return await self._results(named[1], named[2])
        if method == "POST" and parts == ["batches"] and body is not None:
            made = batches.requests(body, self._params)
            payload, _ = await self.http.post(f"{self._url}/batches", msgspec.json.encode(made))
        elif method == "GET" and len(parts) == 2 and parts[0] == "batches":
            payload, _ = await self.http.call("GET", f"{self._url}/batches/{parts[1]}", None)
        elif method == "POST" and len(parts) == 3 and parts[::2] == ["batches", "cancel"]:
            payload, _ = await self.http.post(f"{self._url}/batches/{parts[1]}/cancel", b"")
        else:
            raise NotFound(f"Anthropic's message batches have no {method} {path[:64]}")
        return msgspec.json.encode(batches.batch_object(batches.read_batch(payload)))

    async def _results(self, batch_id: str, which: str) -> bytes:
        """A batch's output or error file, from its results (read where the batch says)."""
        payload, _ = await self.http.call("GET", f"{self._url}/batches/{batch_id}", None)
        url = batches.read_batch(payload).results_url
        # The provider's key goes with the request: only to its own base URL.
        if url is None or not url.startswith(f"{self._url}/batches/"):
            raise BadUpstreamResponse("the message batch has no results_url at its provider")
        results, _ = await self.http.call("GET", url, None)
        return batches.results_file(results, which, to_chat_completion)

    def forwarded_betas(self, request: Outgoing) -> list[str]:
        """The client's betas this provider lets through (`betas` in llms.json), for a body
        relayed as the client wrote it. A beta not listed is dropped, never refused: it would
        switch a feature on (and bill it) on the operator's key."""
        if request.endpoint not in NATIVE or not request.betas:
            return []
        return self.spec.forwarded(request.betas)

    def _betas(self, request: Outgoing) -> dict[str, str] | None:
        """The betas sent: the configured ones and the client's forwarded ones, without
        which Anthropic refuses the fields they enable."""
        forwarded = self.forwarded_betas(request)
        if not forwarded:
            return None
        named = betas_in(",".join((self._configured_betas, *forwarded)))
        return {self._beta_header: ",".join(named)}

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        url = NATIVE.get(request.endpoint, "")
        payload, _ = await self.http.post(self._url + url, self._body(request, upstream_model),
                                          self._betas(request))
        if request.endpoint == "messages/count_tokens":
            return Reply(checked_answer(payload, _Counted))
        if request.endpoint == "messages":
            message = msgspec.json.decode(checked_answer(payload, _Message), type=_Message)
            return Reply(payload, usage=msgspec.convert(usage_of(message.usage), Usage))
        return chat_reply(payload, upstream_model)

    def stream(self, request: Outgoing, upstream_model: str) -> AsyncGenerator[bytes, None]:
        chunks = self.http.stream(self._url, self._body(request, upstream_model),
                                  self._betas(request))
        if request.endpoint == "messages":  # the client speaks Messages too: bytes as they come
            return chunks
        return translated(chunks, StreamTranslator(upstream_model))
