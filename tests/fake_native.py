"""What a fake OpenAI answers on its endpoints besides chat: moderations, rerank (vLLM's Cohere
shape), images (generations, edits: multipart), audio (speech: bytes streamed; transcriptions and
translations: multipart uploads). Shapes and errors as OpenAI's API reference gives them; answers
are deterministic, so a test can check what its client got against what the fake made.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from email import policy
from email.parser import BytesParser
from typing import Any

from aiohttp import web

CATEGORIES = ("hate", "hate/threatening", "harassment", "harassment/threatening", "illicit",
              "illicit/violent", "self-harm", "self-harm/intent", "self-harm/instructions",
              "sexual", "sexual/minors", "violence", "violence/graphic")
AUDIO_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}
SPEECH_CHUNK = 4096


class Refused(Exception):
    """The request is the client's error: OpenAI's 400 envelope, with `param`."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def form_of(body: bytes, content_type: str) -> tuple[dict[str, str], dict[str, list[bytes]]]:
    """A multipart body's text fields and files (by field name), read by the standard library
    (not the gateway's reader, so the two can disagree)."""
    if not content_type.startswith("multipart/form-data"):
        raise Refused("Expected a multipart/form-data upload")
    message = BytesParser(policy=policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    fields: dict[str, str] = {}
    files: dict[str, list[bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if part.get_filename() is not None:
            files.setdefault(str(name), []).append(data)
        else:
            fields[str(name)] = data.decode()
    return fields, files


def moderation(body: dict[str, Any]) -> dict[str, Any]:
    """Texts that mention killing are flagged for violence."""
    given = body.get("input")
    if isinstance(given, str):
        texts = [given]
    elif isinstance(given, list) and given:
        texts = [str(item.get("text", "")) if isinstance(item, dict) else str(item)
                 for item in given]
    else:
        raise Refused("'input' is a required property", "input")

    def result(text: str) -> dict[str, Any]:
        violent = "kill" in text.lower()
        flags = {c: violent and c == "violence" for c in CATEGORIES}
        return {"flagged": violent, "categories": flags,
                "category_scores": {c: 0.9 if flags[c] else 0.001 for c in CATEGORIES},
                "category_applied_input_types": {c: ["text"] for c in CATEGORIES}}

    return {"id": "modr-fake", "model": body.get("model") or "omni-moderation-latest",
            "results": [result(t) for t in texts]}


def relevance(query: str, document: str) -> float:
    """The share of the query's words the document has."""
    words = set(query.lower().split())
    return round(len(words & set(document.lower().split())) / max(1, len(words)), 6)


def rerank(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `/v1/rerank` answer: documents by relevance, best first, `top_n` of them."""
    query, documents = body.get("query"), body.get("documents")
    if not isinstance(query, str):
        raise Refused("query must be a string", "query")
    if not isinstance(documents, list) or not documents:
        raise Refused("documents must be a non-empty list", "documents")
    texts = [d.get("text", "") if isinstance(d, dict) else str(d) for d in documents]
    ranked = sorted(range(len(texts)), key=lambda i: -relevance(query, texts[i]))
    top = body.get("top_n") or len(texts)
    tokens = sum(len(t.split()) for t in [query, *texts])
    return {"id": "rerank-fake", "model": body.get("model"), "usage": {"total_tokens": tokens},
            "results": [{"index": i, "document": {"text": texts[i]},
                         "relevance_score": relevance(query, texts[i])} for i in ranked[:top]]}


def image_bytes(prompt: str, index: int) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + f"{prompt}#{index}".encode()


def images(body: dict[str, Any], source: bytes | None = None) -> dict[str, Any]:
    """An image per `n`: base64 (the GPT image models, or `b64_json` asked) or a URL."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise Refused("'prompt' is a required property", "prompt")
    model = str(body.get("model") or "dall-e-2")
    count = int(body.get("n") or 1)
    as_b64 = body.get("response_format") == "b64_json" or model.startswith("gpt-image")
    made = [image_bytes(prompt if source is None else f"{prompt}|{len(source)}", i)
            for i in range(count)]
    data = [{"b64_json": base64.b64encode(m).decode()} if as_b64
            else {"url": f"https://images.example/{i}.png"} for i, m in enumerate(made)]
    answer: dict[str, Any] = {"created": int(time.time()), "data": data}
    if model.startswith("gpt-image"):
        words = len(prompt.split())
        answer["usage"] = {"total_tokens": words + 272, "input_tokens": words,
                           "output_tokens": 272,
                           "input_tokens_details": {"text_tokens": words, "image_tokens": 0}}
    return answer


def speech_bytes(body: dict[str, Any]) -> bytes:
    """The "audio" for a text: its bytes repeated, after a header (400 bytes a character)."""
    return b"ID3" + str(body.get("input") or "").encode() * 400


async def speech(request: web.Request, body: dict[str, Any],
                 pause: Callable[[], Awaitable[None]] | None = None) -> web.StreamResponse:
    """Audio streamed in chunks (chunked transfer), as OpenAI sends it; `pause` is awaited
    after the first chunk."""
    for field in ("model", "input", "voice"):
        if not body.get(field):
            raise Refused(f"'{field}' is a required property", field)
    kind = str(body.get("response_format") or "mp3")
    if kind not in AUDIO_TYPES:
        raise Refused(f"Invalid response_format {kind!r}", "response_format")
    audio = speech_bytes(body)
    response = web.StreamResponse(headers={"Content-Type": AUDIO_TYPES[kind]})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for at in range(0, len(audio), SPEECH_CHUNK):
        await response.write(audio[at:at + SPEECH_CHUNK])
        if pause is not None and not at:
            await pause()
    await response.write_eof()
    return response


def transcript(fields: dict[str, str], files: dict[str, list[bytes]],
               translate: bool) -> web.Response:
    """The "audio" file's bytes as its text; in the `response_format` asked."""
    if not files.get("file"):
        raise Refused("'file' is a required property", "file")
    if not fields.get("model"):
        raise Refused("'model' is a required property", "model")
    text = files["file"][0].decode("utf-8", "replace").strip()
    if translate:
        text = f"(en) {text}"
    kind = fields.get("response_format", "json")
    if kind == "text":
        return web.Response(text=text + "\n", content_type="text/plain")
    if kind in ("srt", "vtt"):
        cue = "1\n00:00:00,000 --> 00:00:01,000\n" if kind == "srt" \
            else "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\n"
        return web.Response(text=f"{cue}{text}\n", content_type="text/plain")
    seconds = max(1, len(text.split()) // 2)
    usage = {"type": "duration", "seconds": seconds}
    if kind == "verbose_json":
        return web.json_response({"task": "translate" if translate else "transcribe",
                                  "language": "english", "duration": float(seconds),
                                  "text": text, "segments": [], "usage": usage})
    if translate:
        return web.json_response({"text": text})
    return web.json_response({"text": text, "usage": usage})
