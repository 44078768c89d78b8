"""The lines of OpenAI's batch output and error files, pure: written by the gateway's own runner
and by a kind whose upstream runs batches in another shape (Anthropic's message batches)."""

from __future__ import annotations

import secrets
from typing import Any

import msgspec


def request_id() -> str:
    """An id for one output line, as OpenAI's look."""
    return f"batch_req_{secrets.token_hex(12)}"


def answered(custom_id: str, status: int, request_id_: str, body: bytes) -> bytes:
    """The output (or error) file's line for a request that was answered: the answer's
    status and body as a client would have had them."""
    try:
        parsed: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        parsed = body.decode("utf-8", "replace")
    return msgspec.json.encode({
        "id": request_id(), "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id_, "body": parsed},
        "error": None})


def unanswered(custom_id: str, code: str, message: str) -> bytes:
    """The error file's line for a request that never ran (the batch was cancelled or
    expired first)."""
    return msgspec.json.encode({"id": request_id(), "custom_id": custom_id, "response": None,
                                "error": {"code": code, "message": message}})
