"""OpenAI's `File` and `Batch` objects from their rows, pure. A time not reached yet, or a file
not written yet, is left out, as OpenAI's schema has them (present, an integer or a string)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
          "cancelling_at", "cancelled_at")


def file_object(row: Mapping[str, Any]) -> dict[str, Any]:
    """A `File`."""
    return {"id": row["id"], "object": "file", "bytes": row["bytes"],
            "created_at": int(row["created_at"]), "filename": row["filename"],
            "purpose": row["purpose"], "status": "processed"}


def batch_object(row: Mapping[str, Any], counts: Mapping[str, int]) -> dict[str, Any]:
    """A `Batch`: its status, times, files and counts (`counts`: completed and failed so far,
    and the tokens they used)."""
    shown: dict[str, Any] = {
        "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
        "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
        "status": row["status"], "created_at": int(row["created_at"]),
        "expires_at": int(row["expires_at"]),
        "request_counts": {"total": row["total"], "completed": counts.get("completed", 0),
                           "failed": counts.get("failed", 0)},
        "metadata": row["metadata"]}
    if row.get("model"):
        shown["model"] = row["model"]
    if row.get("errors"):
        shown["errors"] = {"object": "list", "data": row["errors"]}
    for name in ("output_file_id", "error_file_id"):
        if row.get(name):
            shown[name] = row[name]
    for name in _TIMES:
        if row.get(name) is not None:
            shown[name] = int(row[name])
    if row.get("provider") is None:
        prompt, completion = counts.get("input_tokens", 0), counts.get("output_tokens", 0)
        shown["usage"] = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": completion,
                          "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": prompt + completion}
    return shown


def page(data: Sequence[dict[str, Any]], limit: int) -> dict[str, Any]:
    """A list page as OpenAI's (`has_more`, the first and last ids)."""
    shown = list(data[:limit])
    return {"object": "list", "data": shown,
            "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None,
            "has_more": len(data) > limit}
