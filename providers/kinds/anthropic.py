"""`"type": "anthropic"`: chat completions translated to Anthropic's Messages API and back.

Translation is pure (`to_messages`, `to_chat_completion`, `StreamTranslator`); the provider only
sends. Approximated: `response_format` becomes an instruction in the system prompt (the Messages
API has no JSON mode), `n` > 1 and `logprobs` are not available, `seed` and penalties are dropped.

Prompt caching: a `cache_control` on a content part, on a message (its last block: LiteLLM's
convention) or on a tool goes on the matching block; past Anthropic's limit of
`MAX_BREAKPOINTS` per request, the earliest are dropped (`limit_breakpoints`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Literal

import msgspec

from providers.contract.chat import ChatRequest, checked, content_text
from providers.contract.errors import BadUpstreamResponse, NotFound, ProviderUnavailable
from providers.contract.messages import STOP_REASONS, THINKING_BUDGETS, image_block, usage_of
from providers.contract.provider import Outgoing, Provider, Reply
from providers.contract.spec import ProviderSpec
from providers.contract.stream import event_object
from providers.contract.translate import translated
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds import anthropic_batches as batches
from providers.wire import sse
from providers.wire.http import HttpUpstream
from providers.wire.upstream_errors import scrub

API_VERSION = "2023-06-01"
DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MAX_TOKENS = 4096
# Anthropic refuses a request with more blocks marked `cache_control` than this (a 400).
MAX_BREAKPOINTS = 4


def to_messages(body: Mapping[str, Any], upstream_model: str) -> dict[str, Any]:
    """The Messages API request for an OpenAI chat-completions body; InvalidRequest names a
    field of the wrong type."""
    checked(body, ChatRequest)  # what follows reads only fields of the types checked here
    system, messages = _conversation(body.get("messages") or ())
    request: dict[str, Any] = {
        "model": upstream_model, "messages": messages,
        "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens")
        or DEFAULT_MAX_TOKENS,
    }
    if schema := format_instruction(body.get("response_format")):
        system.append({"type": "text", "text": schema})
    if any("cache_control" in block for block in system):
        request["system"] = system
    elif system:
        request["system"] = "\n\n".join(block["text"] for block in system)
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            request[name] = body[name]
    if (stop := body.get("stop")) is not None:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("tools"):
        request["tools"] = [_tool(tool) for tool in body["tools"]]
    if (choice := _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))):
        request["tool_choice"] = choice
    if budget := _thinking_budget(body):
        request["thinking"] = {"type": "enabled", "budget_tokens": budget}
        request["max_tokens"] = max(request["max_tokens"], budget + 1024)
        request.pop("temperature", None)  # extended thinking requires the default temperature
    if body.get("user"):
        request["metadata"] = {"user_id": str(body["user"])}
    return limit_breakpoints(request)


def limit_breakpoints(request: dict[str, Any]) -> dict[str, Any]:
    """`request` with at most `MAX_BREAKPOINTS` blocks marked `cache_control`: those nearest
    the end (tools, then system, then messages, as Anthropic reads them) are kept, as each
    cached prefix holds everything before it, so a late breakpoint caches the most."""
    system = request.get("system")
    marked = [block for block in (
        *(request.get("tools") or ()), *(system if isinstance(system, list) else ()),
        *(block for message in request["messages"] for block in message["content"]))
        if "cache_control" in block]
    for block in marked[:-MAX_BREAKPOINTS]:
        del block["cache_control"]
    return request


def cache_control(part: Any) -> dict[str, Any] | None:
    """A part's, message's or tool's `cache_control`, if it has one of the right shape."""
    found = part.get("cache_control") if isinstance(part, dict) else None
    return found if isinstance(found, dict) else None


def _marked(block: dict[str, Any], part: Any) -> dict[str, Any]:
    if (found := cache_control(part)) is not None:
        block["cache_control"] = found
    return block


def _mark_last(blocks: list[dict[str, Any]], message: Any) -> list[dict[str, Any]]:
    """A message's `cache_control` goes on its last block, where its prefix ends."""
    if blocks:
        _marked(blocks[-1], message)
    return blocks


def _conversation(chat: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """System text blocks, and the turns as alternating user/assistant content blocks."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for message in chat:
        role = message.get("role")
        if role in ("system", "developer"):
            system += _mark_last(_system_blocks(message.get("content")), message)
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": message.get("tool_call_id", ""),
                     "content": content_text(message.get("content"))}
            for part in message.get("content") if isinstance(message.get("content"), list) \
                    else ():
                _marked(block, part)
            _append(messages, "user", _mark_last([block], message))
        elif role == "assistant":
            blocks = _blocks(message.get("content"))
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                blocks.append({"type": "tool_use", "id": call.get("id", ""),
                               "name": function.get("name", ""),
                               "input": _json_or_empty(function.get("arguments"))})
            _append(messages, "assistant", _mark_last(blocks, message))
        else:
            _append(messages, "user", _mark_last(_blocks(message.get("content")), message))
    return system, messages


def _system_blocks(content: Any) -> list[dict[str, Any]]:
    """A system message as text blocks: one, unless its parts mark where a cache ends."""
    if isinstance(content, list) and any(cache_control(part) for part in content):
        return [_marked({"type": "text", "text": str(part["text"])}, part) for part in content
                if isinstance(part, dict) and part.get("type") == "text" and part.get("text")]
    text = content_text(content)
    return [{"type": "text", "text": text}] if text else []


def _append(messages: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # The Messages API wants turns to alternate: consecutive same-role turns are merged.
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": role, "content": blocks})


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = []
    for part in content:
        if part.get("type") == "text":
            blocks.append(_marked({"type": "text", "text": part.get("text", "")}, part))
        elif part.get("type") == "image_url":
            image = part.get("image_url") or ""
            blocks.append(_marked(image_block(image if isinstance(image, str)
                                              else image.get("url", "")), part))
    return blocks


def _json_or_empty(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return {}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function") or {}
    declared = {"name": function.get("name", ""),
                "input_schema": function.get("parameters") or {"type": "object"}}
    if function.get("description"):
        declared["description"] = function["description"]
    return _marked(declared, tool)


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None:
        picked: dict[str, Any] | None = {"type": "auto"} if parallel is False else None
    elif choice == "required":
        picked = {"type": "any"}
    elif choice in ("auto", "none"):
        picked = {"type": choice}
    elif isinstance(choice, dict):
        picked = {"type": "tool", "name": (choice.get("function") or {}).get("name", "")}
    else:
        picked = None
    if picked is not None and parallel is False and picked["type"] != "none":
        picked["disable_parallel_tool_use"] = True
    return picked


def _thinking_budget(body: Mapping[str, Any]) -> int | None:
    kwargs = body.get("chat_template_kwargs") or {}
    if kwargs.get("thinking") is False or body.get("enable_thinking") is False:
        return None
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and effort in THINKING_BUDGETS:
        return THINKING_BUDGETS[effort]
    if kwargs.get("thinking") is True or body.get("enable_thinking") is True:
        return THINKING_BUDGETS["medium"]
    return None


def format_instruction(response_format: Any) -> str | None:
    """An instruction asking for the JSON `response_format` wants, for APIs with no JSON mode."""
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_object":
        return "Respond with a single JSON object and nothing else."
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return ("Respond with a single JSON object, and nothing else, that matches this JSON "
                f"schema: {json.dumps(schema)}")
    return None


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

    def _betas(self, request: Outgoing) -> dict[str, str] | None:
        """The client's betas beside the configured ones, for a body relayed as the client
        wrote it: without them Anthropic refuses the fields they enable."""
        if request.endpoint not in NATIVE or not request.betas:
            return None
        named = f"{self._configured_betas},{request.betas}".split(",")
        return {self._beta_header: ",".join(dict.fromkeys(b.strip() for b in named
                                                           if b.strip()))}

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
