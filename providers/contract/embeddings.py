"""`/v1/embeddings` in OpenAI's shape: what a kind reads of a request, and the list it answers.

Kinds that translate (Gemini's `batchEmbedContents`, Ollama's `/api/embed`) read the inputs with
`inputs()` and build the answer with `embedding_list()`; the `openai` kind relays bytes and only
checks them (`check_list`). Splitting a batch to a provider's limit and joining the parts is
pure too (`batches`, `joined`), so it is the same for every kind.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from providers.contract.errors import BadUpstreamResponse, InvalidRequest
from providers.contract.usage import MAX_TOKENS

Input = str | list[int]
MAX_INPUTS = 2048  # OpenAI's own limit per request


def inputs(body: Mapping[str, Any]) -> list[Input]:
    """The request's inputs as a list: a string, a token array, or a list of either."""
    given = body.get("input")
    if isinstance(given, str):
        return [given]
    if isinstance(given, list) and given and all(isinstance(x, int) for x in given):
        return [list(given)]
    return list(given) if isinstance(given, list) else []


def texts(body: Mapping[str, Any], provider: str) -> list[str]:
    """The inputs as text, for a kind that cannot embed token ids (a 400 naming `input`)."""
    found = inputs(body)
    if not all(isinstance(x, str) for x in found):
        raise InvalidRequest(f"provider '{provider}' embeds text only, not token arrays",
                             param="input")
    return [x for x in found if isinstance(x, str)]


def base64_of(vector: Sequence[float]) -> str:
    """A vector as OpenAI encodes it for `encoding_format: base64`: little-endian float32."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embedding_list(vectors: Sequence[Sequence[float]], model: str, prompt_tokens: int,
                   encoding_format: str | None) -> dict[str, Any]:
    """OpenAI's `CreateEmbeddingResponse` for vectors in input order."""
    encode = base64_of if encoding_format == "base64" else list
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": index, "embedding": encode(vector)}
                     for index, vector in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def estimated_tokens(texts: Sequence[str]) -> int:
    """A token count for upstreams that report none: about four characters a token."""
    return sum(max(1, (len(text) + 3) // 4) for text in texts)


class _Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str


class _List(msgspec.Struct):
    data: list[_Embedding]


def check_count(answered: int, expected: int) -> None:
    """Fail over on an answer with other than one vector per input."""
    if answered != expected:
        raise BadUpstreamResponse(f"answered {answered} embeddings for {expected} inputs")


def check_list(body: bytes, expected: int) -> None:
    """Fail over on an answer that is not an embedding list with one vector per input."""
    try:
        answer = msgspec.json.decode(body, type=_List)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not an embedding list: {exc}") from None
    if sorted(e.index for e in answer.data) != list(range(expected)):
        raise BadUpstreamResponse(f"answered {len(answer.data)} embeddings for {expected} "
                                  "inputs")


def batches(body: Mapping[str, Any], limit: int | None) -> list[dict[str, Any]] | None:
    """The request split into bodies of at most `limit` inputs, or None when it fits."""
    found = inputs(body)
    if limit is None or len(found) <= limit:
        return None
    return [{**body, "input": found[start:start + limit]}
            for start in range(0, len(found), limit)]


def joined(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The answers to `batches`, in order, as one list: indexes renumbered, usage summed."""
    data: list[dict[str, Any]] = []
    prompt = total = 0
    for part in parts:
        offset = len(data)
        for item in sorted(part.get("data") or (), key=lambda e: e["index"]):
            data.append({**item, "index": offset + item["index"]})
        usage = part.get("usage") or {}
        prompt += usage.get("prompt_tokens") or 0
        total += usage.get("total_tokens") or 0
    if not 0 <= prompt <= MAX_TOKENS or not 0 <= total <= MAX_TOKENS:
        # Each part was in bounds; their sum is not: no upstream counted that honestly.
        raise BadUpstreamResponse(f"the batches' usage adds up to {total} tokens")
    first = parts[0]
    return {**first, "data": data, "usage": {"prompt_tokens": prompt, "total_tokens": total}}
