"""A fake Gemini API: the same modes as `FakeUpstream`, in Gemini's wire format.

Answers are built with the official SDK's types (`google.genai.types`) and dumped by alias, so
their field names are Gemini's own; requests are checked against the same types, and a field the
real API would reject (an unknown name, `additionalProperties`, an OBJECT with no properties) is
answered 400 INVALID_ARGUMENT as Gemini does. Streams are SSE framed with CRLF, like Gemini's.
"""

from __future__ import annotations

import asyncio
import base64
import json
from dataclasses import dataclass
from typing import Any

import pydantic
from aiohttp import web
from google.genai import types

from tests.upstream import (
    FakeUpstream,
    Mode,
    _abort,
    _garbage_stream,
    _n,
    _Shape,
    _words,
    continued,
    embedding_problem,
    vector,
)

STATUSES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
            404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
            504: "DEADLINE_EXCEEDED"}
FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY",
          "tool_calls": "STOP"}
SIGNATURE = base64.b64encode(b"fake thought signature").decode()
BAD_KEY = "API key not valid. Please pass a valid API key."
EMBEDDING_MODEL = "text-embedding-004"  # listed, but cannot generateContent
# The request fields and the SDK type each must validate as (snake_case is accepted too).
REQUEST_FIELDS: dict[str, Any] = {
    "contents": list[types.Content], "systemInstruction": types.Content,
    "tools": list[types.Tool], "toolConfig": types.ToolConfig,
    "generationConfig": types.GenerationConfig, "safetySettings": list[types.SafetySetting],
    "cachedContent": str}


def safety_block() -> Mode:
    """Refuse the prompt itself: `promptFeedback.blockReason`, no candidates."""
    return Mode("blocked")


def error_body(code: int, message: str | None = None, reason: str | None = None) -> bytes:
    """Gemini's error envelope, as Google APIs send it."""
    error: dict[str, Any] = {"code": code, "message": message or f"fake {code}",
                             "status": STATUSES.get(code, "UNKNOWN")}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                             "reason": reason, "domain": "googleapis.com"}]
    return json.dumps({"error": error}).encode()


def gemini_error(code: int, message: str | None = None, reason: str | None = None,
                 body: bytes | None = None) -> web.Response:
    return web.Response(status=code, body=body or error_body(code, message, reason),
                        content_type="application/json")


def request_problem(body: Any) -> str | None:
    """What the real API would reject in this request body, if anything."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received."
    for name, value in body.items():
        field = REQUEST_FIELDS.get(_camel(name))
        if field is None:
            return f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
        try:
            pydantic.TypeAdapter(field).validate_json(json.dumps(value))
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join([name, *map(str, first["loc"])])
            return f"Invalid value at '{where}': {first['msg']}"
    return _schema_problem(body.get("tools") or [])


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def _schema_problem(node: Any) -> str | None:
    # The SDK's Schema type also serves Vertex AI, which has these; the Gemini API does not.
    if isinstance(node, list):
        return next((p for p in map(_schema_problem, node) if p), None)
    if not isinstance(node, dict):
        return None
    if "additionalProperties" in node or "additional_properties" in node:
        return ('Invalid JSON payload received. Unknown name "additionalProperties": '
                "Cannot find field.")
    if str(node.get("type", "")).upper() == "OBJECT" and node.get("properties") == {}:
        return "parameters.properties: should be non-empty for OBJECT type"
    return next((p for p in map(_schema_problem, node.values()) if p), None)


@dataclass
class _Call(_Shape):
    """One `models/{model}:{method}` call."""

    model: str
    streaming: bool
    fake: str = "gemini"

    def _parts(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[types.Part]:
        parts: list[types.Part] = []
        thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
        if mode.reasoning and thinking.get("includeThoughts"):
            parts.append(types.Part(text=mode.reasoning, thought=True))
        parts += [types.Part(text=piece) for piece in pieces if piece]
        if mode.tool:
            parts.append(types.Part(
                function_call=types.FunctionCall(name=mode.tool[0], args=json.loads(mode.tool[1])),
                thought_signature=base64.b64decode(SIGNATURE)))
        return parts

    def _response(self, body: dict[str, Any], parts: list[types.Part], mode: Mode,
                finished: bool, output_tokens: int) -> dict[str, Any]:
        count = _n({"n": (body.get("generationConfig") or {}).get("candidateCount")})
        candidates = [types.Candidate(
            content=types.Content(role="model", parts=parts) if parts else None, index=index,
            finish_reason=FINISH.get(mode.finish_reason, "STOP") if finished else None)
            for index in range(count)]
        thoughts = 7 if mode.reasoning else None
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=10, candidates_token_count=output_tokens,
            thoughts_token_count=thoughts, cached_content_token_count=4 if mode.usage else None,
            total_token_count=10 + output_tokens + (thoughts or 0))
        answer = types.GenerateContentResponse(candidates=candidates, usage_metadata=usage,
                                               model_version=self.model, response_id="fakeResp")
        return answer.model_dump(mode="json", exclude_none=True, by_alias=True)

    def whole(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> dict[str, Any]:
        if mode.kind == "blocked":
            return blocked(self.model)
        return self._response(body, self._parts(body, pieces, mode), mode, True, len(pieces))

    def events(self, body: dict[str, Any], pieces: list[str], mode: Mode) -> list[dict[str, Any]]:
        if mode.kind == "blocked":
            return [blocked(self.model)]
        parts = self._parts(body, pieces, mode)
        events = [self._response(body, [part], mode, number == len(parts) - 1, number + 1)
                  for number, part in enumerate(parts)]
        return events or [self._response(body, [], mode, True, 0)]


def as_chat_continued(body: dict[str, Any], pieces: list[str]) -> list[str]:
    """The answer `pieces` as a model asked in words to go on with a partial one of it says it
    (`tests.upstream.continued`): Gemini has no prefill, a trailing model turn is no more
    than history."""
    messages = [{"role": "assistant" if c.get("role") == "model" else "user",
                 "content": "".join(str(p.get("text", "")) for p in c.get("parts") or ())}
                for c in body.get("contents") or () if isinstance(c, dict)]
    return continued({"messages": messages}, pieces)


def blocked(model: str) -> dict[str, Any]:
    """An answer refusing the prompt: feedback and usage, no candidates."""
    answer = types.GenerateContentResponse(
        prompt_feedback=types.GenerateContentResponsePromptFeedback(
            block_reason=types.BlockedReason.SAFETY,
            safety_ratings=[types.SafetyRating(category="HARM_CATEGORY_DANGEROUS_CONTENT",
                                               probability="HIGH", blocked=True)]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=10,
                                                                  total_token_count=10),
        model_version=model, response_id="fakeBlocked")
    return answer.model_dump(mode="json", exclude_none=True, by_alias=True)


@dataclass
class FakeGemini(FakeUpstream):
    """POST /v1beta/models/{model}:generateContent and :streamGenerateContent; GET models."""

    name: str = "gemini"
    key: str | None = None  # when set, any other x-goog-api-key is answered 400 API_KEY_INVALID
    page_size: int = 50

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1beta"

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1beta/models/{call}", self._generate)
        app.router.add_get("/v1beta/models", self._models)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        model, _, method = request.match_info["call"].partition(":")
        if method == "batchEmbedContents":
            return await self._batch_embed(request, model)
        if method not in ("generateContent", "streamGenerateContent"):
            await self._record(request)
            return gemini_error(404, f"Method {method!r} not found")
        streaming = method == "streamGenerateContent"
        return await self._answer(request, _Call(model, streaming, self.name))

    async def _play(self, request: web.Request, mode: Mode, body: dict[str, Any],
                    shape: _Shape) -> web.StreamResponse:
        assert isinstance(shape, _Call)
        if self.key is not None and request.headers.get("x-goog-api-key") != self.key:
            return gemini_error(400, BAD_KEY, "API_KEY_INVALID")
        if problem := request_problem(body):
            return gemini_error(400, problem)
        if mode.kind == "status":
            return gemini_error(mode.code, mode.message, body=mode.body)
        if mode.kind == "sse_garbage" and shape.streaming:
            return await _garbage_stream(request)
        answers = ("ok", "blocked", "cut") if shape.streaming else ("ok", "blocked")
        if mode.kind not in answers:  # hang, slow, bad bodies, a cut JSON answer
            return await super()._play(request, mode, body, shape)
        content = f"Hello from {self.name}" if mode.content is None else mode.content
        pieces = as_chat_continued(body, list(mode.chunks) if mode.chunks else _words(content))
        if not shape.streaming:
            return web.json_response(shape.whole(body, pieces, mode))
        if request.query.get("alt") != "sse":  # without alt=sse Gemini streams a JSON array
            return web.json_response(shape.events(body, pieces, mode))
        return await self._sse(request, shape.events(body, pieces, mode), mode)

    async def _batch_embed(self, request: web.Request, model: str) -> web.Response:
        """As the real API: every request names the URL's model, one text part each."""
        body = await self._record(request)
        mode = self._next_mode()
        if self.key is not None and request.headers.get("x-goog-api-key") != self.key:
            return gemini_error(400, BAD_KEY, "API_KEY_INVALID")
        if mode.kind == "status":
            return gemini_error(mode.code, mode.message, body=mode.body)
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or len(requests) > 100:
            return gemini_error(400, "* BatchEmbedContentsRequest.requests: at most 100 "
                                     "requests can be in one batch")
        embeddings = []
        for number, one in enumerate(requests):
            if one.get("model") != f"models/{model}":
                return gemini_error(400, f"requests[{number}].model: must be models/{model}")
            parts = (one.get("content") or {}).get("parts") or []
            text = " ".join(str(p.get("text", "")) for p in parts)
            if problem := embedding_problem(one, "outputDimensionality"):
                return gemini_error(400, problem)
            size = one.get("outputDimensionality") or 8
            embeddings.append(types.ContentEmbedding(values=vector(text, size)))
        # The SDK reads a batchEmbedContents answer as this type (embed_content uses it).
        answer = types.EmbedContentResponse(embeddings=embeddings)
        return web.json_response(answer.model_dump(mode="json", exclude_none=True,
                                                   by_alias=True))

    async def _sse(self, request: web.Request, events: list[dict[str, Any]],
                   mode: Mode) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if mode.kind == "cut":
            events = events[:mode.after_chunks]
        for number, event in enumerate(events):
            if number and mode.delay_between_chunks:
                await asyncio.sleep(mode.delay_between_chunks)
            await response.write(b"data: " + json.dumps(event).encode() + b"\r\n\r\n")
        if mode.kind == "cut":
            await asyncio.sleep(0.1)  # let what came before reach the client first
            _abort(request)
            return response
        await response.write_eof()
        return response

    async def _models(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.key is not None and request.headers.get("x-goog-api-key") != self.key:
            return gemini_error(400, BAD_KEY, "API_KEY_INVALID")
        listed = [_model(name, ["generateContent", "countTokens"]) for name in self.models]
        listed.append(_model(EMBEDDING_MODEL, ["embedContent"]))
        start = int(request.query.get("pageToken") or 0)
        size = min(int(request.query.get("pageSize") or 50), self.page_size)
        page: dict[str, Any] = {"models": listed[start:start + size]}
        if start + size < len(listed):
            page["nextPageToken"] = str(start + size)
        return web.json_response(page)


def _model(name: str, methods: list[str]) -> dict[str, Any]:
    # By hand: the SDK's Model type renames supportedGenerationMethods to supported_actions.
    return {"name": f"models/{name}", "version": "001", "displayName": name,
            "inputTokenLimit": 1048576, "outputTokenLimit": 65536,
            "supportedGenerationMethods": methods}

