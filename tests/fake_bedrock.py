"""A fake AWS Bedrock runtime: Converse, ConverseStream, InvokeModel (Titan embeddings, Claude)
and InvokeModelWithResponseStream, with the same modes as `FakeUpstream`.

It checks what AWS checks before anything else: the SigV4 signature is recomputed from the
request as received (method, raw path, signed headers, body) with botocore's signer and the
secret the test gave, and a mismatch is AWS's 403 `InvalidSignatureException`; an unknown key
id or session token is `UnrecognizedClientException`, an expired token `ExpiredTokenException`.
Streams are AWS event-stream messages encoded here per the spec (prelude with its CRC, typed
headers, payload, message CRC); a stream's failure is an exception message, as AWS sends it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hmac
import itertools
import json
import struct
import zlib
from typing import Any

from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import ReadOnlyCredentials

from tests.fake_anthropic import MAX_BREAKPOINTS, FakeAnthropic, cache_problem
from tests.upstream import Mode, _words, echoed, vector

SIGNATURE_MISMATCH = ("The request signature we calculated does not match the signature you "
                      "provided. Check your AWS Secret Access Key and signing method. Consult "
                      "the service documentation for details.")
BAD_TOKEN = "The security token included in the request is invalid."
EXPIRED_TOKEN = "The security token included in the request is expired"
TOO_LONG = "Input is too long for requested model."
EXCEPTIONS = {400: "ValidationException", 403: "AccessDeniedException",
              404: "ResourceNotFoundException", 408: "ModelTimeoutException",
              424: "ModelErrorException", 429: "ThrottlingException",
              500: "InternalServerException", 503: "ServiceUnavailableException"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "content_filter": "content_filtered"}
CONVERSE_FIELDS = frozenset({"messages", "system", "inferenceConfig", "toolConfig",
                             "guardrailConfig", "additionalModelRequestFields",
                             "additionalModelResponseFieldPaths", "promptVariables",
                             "requestMetadata", "performanceConfig"})
BLOCK_KINDS = frozenset({"text", "image", "document", "video", "toolUse", "toolResult",
                         "guardContent", "cachePoint", "reasoningContent"})
TITAN_DIMENSIONS = (256, 512, 1024)
MAX_SKEW = datetime.timedelta(minutes=5)


def exception_event(kind: str, after_chunks: int = 2) -> Mode:
    """A stream that sends its opening and `after_chunks` deltas, then an exception message
    of type `kind` (`throttlingException`, `modelStreamErrorException`, …)."""
    return Mode("exception", message=kind, after_chunks=after_chunks)


def frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (total and headers length) and its CRC32,
    string-typed headers, the payload, and the CRC32 of all that."""
    encoded = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        encoded += bytes([len(raw_name)]) + raw_name + b"\x07" \
            + struct.pack(">H", len(raw_value)) + raw_value
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def event(kind: str, body: dict[str, Any]) -> bytes:
    """An `event` message; AWS pads each payload with a `p` field to hide its length."""
    payload = json.dumps({**body, "p": "abcdefghijklmnopqrstuvwxyz"[:len(kind)]}).encode()
    return frame({":event-type": kind, ":content-type": "application/json",
                  ":message-type": "event"}, payload)


def exception(kind: str, message: str) -> bytes:
    """An `exception` message, as a stream that fails after it began carries it."""
    return frame({":exception-type": kind, ":content-type": "application/json",
                  ":message-type": "exception"}, json.dumps({"message": message}).encode())


def aws_error(status: int, kind: str, message: str) -> web.Response:
    """AWS's JSON error: the message in the body, the type in `x-amzn-ErrorType`."""
    return web.json_response({"message": message}, status=status, headers={
        "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.coral.service/",
        "x-amzn-RequestId": "fake-request-id"})


def signature_problem(request: web.Request, body: bytes, keys: dict[str, str],
                      tokens: dict[str, str]) -> web.Response | None:
    """AWS's 403 for a request whose SigV4 signature is not the one `keys` (key id → secret)
    make of it as received, else None; `tokens` is key id → the session token it needs."""
    scheme, _, fields = request.headers.get("Authorization", "").partition(" ")
    parts = dict(part.strip().split("=", 1) for part in fields.split(",") if "=" in part)
    scope = parts.get("Credential", "").split("/")
    if scheme != "AWS4-HMAC-SHA256" or len(scope) != 5 or "Signature" not in parts:
        return aws_error(403, "IncompleteSignatureException", "Authorization header requires "
                         "'Credential', 'Signature' and 'SignedHeaders' parameters.")
    key_id, _, region, service, _ = scope
    token = request.headers.get("X-Amz-Security-Token")
    if key_id not in keys or tokens.get(key_id) not in (None, token):
        return aws_error(403, "UnrecognizedClientException", BAD_TOKEN)
    if token is not None and token.startswith("expired"):
        return aws_error(403, "ExpiredTokenException", EXPIRED_TOKEN)
    stamp = request.headers.get("X-Amz-Date", "")
    try:
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return aws_error(403, "IncompleteSignatureException", "X-Amz-Date is missing")
    if abs(datetime.datetime.now(datetime.UTC) - when) > MAX_SKEW:
        return aws_error(403, "InvalidSignatureException", f"Signature expired: {stamp}")
    signed = {name: request.headers.get(name, "") for name in parts["SignedHeaders"].split(";")}
    received = AWSRequest(method=request.method, url=f"http://{request.host}{request.raw_path}",
                          data=body, headers=signed)
    received.context["timestamp"] = stamp
    signer = SigV4Auth(ReadOnlyCredentials(key_id, keys[key_id], token), service, region)
    expected = signer.signature(signer.string_to_sign(received,
                                                      signer.canonical_request(received)),
                                received)
    if not hmac.compare_digest(expected, parts["Signature"]):
        return aws_error(403, "InvalidSignatureException", SIGNATURE_MISMATCH)
    return None


def cache_points(body: dict[str, Any]) -> list[tuple[Any, str | None]]:
    """A Converse body's blocks in the order Bedrock reads them (tools, system, messages), each
    with the TTL of the breakpoint it ends if a `cachePoint` follows it."""
    lists = [(body.get("toolConfig") or {}).get("tools") or [], body.get("system") or [],
             *(message.get("content") or [] for message in body.get("messages") or ())]
    blocks: list[tuple[Any, str | None]] = []
    for listed in lists:
        for block in listed:
            if isinstance(block, dict) and "cachePoint" in block:
                if blocks:
                    blocks[-1] = (blocks[-1][0], "5m")
            else:
                blocks.append((block, None))
    return blocks


def cache_point_problem(model: str, body: dict[str, Any]) -> str | None:
    """What Bedrock refuses of a body's cache points, if anything."""
    points = sum(ttl is not None for _, ttl in cache_points(body))
    if points and "amazon.nova" not in model:
        return "You invoked an unsupported model or your request did not allow prompt " \
            "caching. See the documentation for more information."
    if points > MAX_BREAKPOINTS:
        return f"The number of cache points ({points}) exceeds the maximum of " \
            f"{MAX_BREAKPOINTS}."
    return None


def converse_problem(body: Any) -> str | None:
    """What Converse's validation would refuse in a body, if anything."""
    if not isinstance(body, dict):
        return "Malformed input request, please reformat your input and try again."
    if extra := set(body) - CONVERSE_FIELDS:
        return f"Malformed input request: extraneous key [{sorted(extra)[0]}] is not permitted"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "The messages field is required."
    if messages[0].get("role") != "user":
        return "A conversation must start with a user message. Try again with a conversation " \
            "that starts with a user message."
    for before, after in itertools.pairwise(messages):
        if before.get("role") == after.get("role"):
            return "A conversation must alternate between user and assistant roles."
    for message in messages:
        for block in message.get("content") or [None]:
            if not isinstance(block, dict) or len(block) != 1 or set(block) - BLOCK_KINDS:
                return "The content field in the Message object is malformed."
            if block.get("text") == "":
                return "The text field in the ContentBlock object is blank."
    return None


class FakeBedrock(FakeAnthropic):
    """bedrock-runtime's model routes; Claude's answers are the fake Anthropic's own."""

    def __init__(self, name: str = "bedrock", keys: dict[str, str] | None = None,
                 tokens: dict[str, str] | None = None, api_keys: tuple[str, ...] = ()) -> None:
        super().__init__(name=name)
        self.keys = dict(keys or {})
        self.tokens = dict(tokens or {})
        self.api_keys = api_keys  # Bedrock API keys, sent as bearer tokens
        self.refusals: list[str] = []  # the error types of requests refused before any model
        self.cached: dict[str, int] | None = None  # the last Converse prompt's cache usage

    @property
    def url(self) -> str:
        """The endpoint's root, as `https://bedrock-runtime.REGION.amazonaws.com` is."""
        return f"http://127.0.0.1:{self.port}"

    def _routes(self, app: web.Application) -> None:
        for operation in ("converse", "converse-stream", "invoke",
                          "invoke-with-response-stream"):
            app.router.add_post(f"/model/{{model}}/{operation}", self._operation)

    async def _operation(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if (refusal := self._auth_problem(request, await request.read())) is not None:
            self.refusals.append(refusal.headers["x-amzn-ErrorType"].split(":")[0])
            return refusal
        model = request.match_info["model"]
        operation = request.path.rsplit("/", 1)[-1]
        streaming = operation.endswith("stream")
        mode = self._next_mode()
        if mode.kind == "status":
            return aws_error(mode.code, EXCEPTIONS.get(mode.code, "InternalServerException"),
                             mode.message or f"fake {mode.code}")
        if mode.kind == "echo" and (mode.message == "whole" or not streaming):
            return aws_error(mode.code, EXCEPTIONS.get(mode.code, "InternalServerException"),
                             f"debug: {echoed(request)}")
        if mode.kind == "hang":
            await asyncio.sleep(3600)
        if model.startswith("amazon.titan-embed"):
            return self._titan(body)
        if model.startswith("anthropic."):
            return await self._claude(request, body, mode, streaming)
        if problem := converse_problem(body) or cache_point_problem(model, body):
            return aws_error(400, "ValidationException", problem)
        self.cached = self._cache_usage(body)
        if streaming:
            return await self._converse_stream(request, mode)
        return web.json_response(self._converse(mode), headers={
            "x-amzn-RequestId": f"fake-{len(self.requests)}"})

    def _auth_problem(self, request: web.Request, body: bytes) -> web.Response | None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer":
            return signature_problem(request, body, self.keys, self.tokens)
        if value in self.api_keys:
            return None
        return aws_error(403, "AccessDeniedException",
                         "Authentication failed: Please make sure your API Key is valid.")

    # -- Titan embeddings ---------------------------------------------------------------------

    def _titan(self, body: Any) -> web.Response:
        if not isinstance(body, dict) or set(body) - {"inputText", "dimensions", "normalize",
                                                      "embeddingTypes"}:
            extra = sorted(set(body) - {"inputText"}) if isinstance(body, dict) else ["?"]
            return aws_error(400, "ValidationException",
                             f"Malformed input request: #: extraneous key [{extra[0]}] is not "
                             "permitted, please reformat your input and try again.")
        text = body.get("inputText")
        dimensions = body.get("dimensions", 1024)
        if not isinstance(text, str) or not text or dimensions not in TITAN_DIMENSIONS:
            return aws_error(400, "ValidationException", "Malformed input request: "
                             "#/inputText: expected minLength: 1, actual: 0")
        embedding = vector(text, dimensions)
        return web.json_response({"embedding": embedding, "embeddingsByType": {
            "float": embedding}, "inputTextTokenCount": len(text.split())})

    # -- Converse -----------------------------------------------------------------------------

    def _pieces(self, mode: Mode) -> list[str]:
        if mode.chunks:
            return [piece for piece in mode.chunks if piece]
        return _words(mode.content if mode.content is not None else f"Hello from {self.name}")

    def _text(self, mode: Mode) -> str:
        return "".join(self._pieces(mode))

    def _cache_usage(self, body: dict[str, Any]) -> dict[str, int] | None:
        """Converse's usage of a prompt with cache points, as the prompt cache counts it."""
        blocks = cache_points(body)
        if not any(ttl for _, ttl in blocks):
            return None
        found = self.cache.usage(blocks)
        return {"inputTokens": found["input_tokens"],
                "cacheReadInputTokens": found["cache_read_input_tokens"],
                "cacheWriteInputTokens": found["cache_creation_input_tokens"]}

    def _usage(self, mode: Mode, output: int) -> dict[str, int]:
        if self.cached is not None:
            return {**self.cached, "outputTokens": output,
                    "totalTokens": sum(self.cached.values()) + output}
        usage = {"inputTokens": 10, "outputTokens": output, "totalTokens": 10 + output}
        if mode.usage:
            usage["cacheReadInputTokens"] = 4
            usage["totalTokens"] += 4
        return usage

    def _converse(self, mode: Mode) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if mode.reasoning:
            content.append({"reasoningContent": {"reasoningText": {
                "text": mode.reasoning, "signature": "fake-signature"}}})
        if text := self._text(mode):
            content.append({"text": text})
        if mode.tool:
            content.append({"toolUse": {"toolUseId": "tooluse_fake1", "name": mode.tool[0],
                                        "input": json.loads(mode.tool[1])}})
        return {"output": {"message": {"role": "assistant", "content": content}},
                "stopReason": STOP_REASONS.get(mode.finish_reason, "end_turn"),
                "usage": self._usage(mode, len(self._pieces(mode))),
                "metrics": {"latencyMs": 12}}

    def _converse_events(self, mode: Mode) -> list[bytes]:
        events = [event("messageStart", {"role": "assistant"})]
        index = 0
        if mode.reasoning:
            events += [event("contentBlockDelta", {"contentBlockIndex": index, "delta": {
                "reasoningContent": {"text": mode.reasoning}}}),
                event("contentBlockDelta", {"contentBlockIndex": index, "delta": {
                    "reasoningContent": {"signature": "fake-signature"}}}),
                event("contentBlockStop", {"contentBlockIndex": index})]
            index += 1
        if self._pieces(mode):
            events += [event("contentBlockDelta", {"contentBlockIndex": index,
                                                   "delta": {"text": word}})
                       for word in self._pieces(mode)]
            events.append(event("contentBlockStop", {"contentBlockIndex": index}))
            index += 1
        if mode.tool:
            events.append(event("contentBlockStart", {"contentBlockIndex": index, "start": {
                "toolUse": {"toolUseId": "tooluse_fake1", "name": mode.tool[0]}}}))
            raw = mode.tool[1]
            third = max(1, len(raw) // 3)
            events += [event("contentBlockDelta", {"contentBlockIndex": index, "delta": {
                "toolUse": {"input": raw[i:i + third]}}}) for i in range(0, len(raw), third)]
            events.append(event("contentBlockStop", {"contentBlockIndex": index}))
        events += [event("messageStop", {"stopReason": STOP_REASONS.get(mode.finish_reason,
                                                                        "end_turn")}),
                   event("metadata", {"usage": self._usage(mode, len(self._pieces(mode))),
                                      "metrics": {"latencyMs": 12}})]
        return events

    async def _converse_stream(self, request: web.Request, mode: Mode) -> web.StreamResponse:
        return await self._write(request, mode, self._converse_events(mode))

    async def _write(self, request: web.Request, mode: Mode,
                     events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "application/vnd.amazon.eventstream",
            "x-amzn-RequestId": f"fake-{len(self.requests)}"})
        await response.prepare(request)
        if mode.kind == "echo":  # an exception quoting the request's headers
            kept = events[:2] if mode.message == "mid" else []
            events = [*kept, exception("modelStreamErrorException", f"debug: {echoed(request)}")]
        elif mode.kind == "exception":
            events = [*events[:1 + mode.after_chunks],
                      exception(mode.message or "modelStreamErrorException",
                                "The model failed to continue the stream.")]
        try:
            for number, message in enumerate(events):
                if number and (number == len(events) - 1 and mode.kind in ("echo", "exception")):
                    await asyncio.sleep(0.1)  # what came before reaches the client first
                elif number and mode.delay_between_chunks:
                    await asyncio.sleep(mode.delay_between_chunks)
                await response.write(message)
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self._count_cancel()
            raise
        return response

    # -- Claude through InvokeModel -----------------------------------------------------------

    async def _claude(self, request: web.Request, body: Any, mode: Mode,
                      streaming: bool) -> web.StreamResponse:
        if not isinstance(body, dict) or body.get("anthropic_version") != "bedrock-2023-05-31":
            return aws_error(400, "ValidationException",
                             "Malformed input request: #: required key [anthropic_version] "
                             "not found, please reformat your input and try again.")
        if extra := {"model", "stream"} & set(body):
            return aws_error(400, "ValidationException", "Malformed input request: #: "
                             f"extraneous key [{sorted(extra)[0]}] is not permitted, please "
                             "reformat your input and try again.")
        if problem := cache_problem(body):
            return aws_error(400, "ValidationException", problem)
        if not streaming:
            return web.json_response(self._message(mode, body))
        chunks = []
        for message_event in self._events(mode, body):
            if message_event["type"] == "ping":
                continue  # Bedrock leaves Anthropic's pings out
            if message_event["type"] == "message_stop":
                message_event["amazon-bedrock-invocationMetrics"] = {
                    "inputTokenCount": 10, "outputTokenCount": 5, "invocationLatency": 12,
                    "firstByteLatency": 3}
            wrapped = base64.b64encode(json.dumps(message_event).encode()).decode()
            chunks.append(event("chunk", {"bytes": wrapped}))
        return await self._write(request, mode, chunks)
