"""The relay endpoints, in one catalogue: each one's name, the head the gateway reads of its body,
and what the rest of the gateway derives from it (the routes the edge serves, the endpoints that
generate, those whose whole answers may come from a stream, uploads and their bounds, Anthropic's
dialect). A new endpoint is a row here, then the stages and adapters that serve it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core import schemas
from gateway.core.messages import CountTokensRequest, MessagesRequest

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One relay endpoint, as the gateway treats it."""

    name: str  # its path under /v1
    head: type[Any]  # what the gateway parses of its body (`gateway.core.schemas`)
    generates: bool = False  # it makes an answer worth paying for once (`Idempotency-Key`)
    # Its whole answers can be assembled from a stream, and kept in the response cache.
    streamed_whole: bool = False
    native: bool = False  # relayed as OpenAI wrote it, to providers that serve it themselves
    # A multipart upload, bounded as OpenAI bounds it (its API reference: audio files up to
    # 25 MB, images for an edit up to 50 MB); `server.max_body_bytes` bounds it too.
    upload_limit: int | None = None
    anthropic: bool = False  # its clients read Anthropic's error shape


CATALOGUE: Mapping[str, Endpoint] = {e.name: e for e in (
    Endpoint("chat/completions", schemas.ChatHead, generates=True, streamed_whole=True),
    Endpoint("completions", schemas.CompletionHead, generates=True, streamed_whole=True),
    Endpoint("responses", schemas.ResponsesHead, generates=True),
    Endpoint("embeddings", schemas.EmbeddingsHead, generates=True),
    Endpoint("messages", MessagesRequest, generates=True, anthropic=True),
    Endpoint("messages/count_tokens", CountTokensRequest, anthropic=True),
    Endpoint("moderations", schemas.ModerationsHead, native=True),
    Endpoint("rerank", schemas.RerankHead, native=True),
    Endpoint("images/generations", schemas.ImagesHead, native=True),
    Endpoint("audio/speech", schemas.SpeechHead, native=True),
    Endpoint("audio/transcriptions", schemas.TranscriptionHead, native=True,
             upload_limit=25 * MB),
    Endpoint("audio/translations", schemas.TranscriptionHead, native=True,
             upload_limit=25 * MB),
    Endpoint("images/edits", schemas.ImageEditHead, native=True, upload_limit=50 * MB),
)}

RELAYED = tuple(CATALOGUE)
HEADS: Mapping[str, type[Any]] = {e.name: e.head for e in CATALOGUE.values()}
GENERATING = frozenset(e.name for e in CATALOGUE.values() if e.generates)
STREAMED_WHOLE = frozenset(e.name for e in CATALOGUE.values() if e.streamed_whole)
NATIVE = tuple(e.name for e in CATALOGUE.values() if e.native)
UPLOADS: Mapping[str, int] = {e.name: e.upload_limit for e in CATALOGUE.values()
                              if e.upload_limit is not None}
ANTHROPIC = frozenset(e.name for e in CATALOGUE.values() if e.anthropic)
