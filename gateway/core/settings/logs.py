"""The request log's settings (`logs` in llms.json, `gateway.requestlog`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

MiB = 1024 * 1024


Capture = Literal["metadata", "bodies"]


class LogCapture(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the request log keeps of one alias's or key's requests (`models.<alias>.logs`, a
    key's `logs` on `/admin/keys`): metadata only, or their bodies too."""

    capture: Capture


class LogsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The request log in the accounts database (`gateway.requestlog`): a row per request once
    `logs` is in llms.json; bodies where `capture` is "bodies", never for a `private` key."""

    capture: Capture = "metadata"
    # Rows older than this, or past the newest `max_rows`, are purged (in small batches).
    retention_days: Annotated[float, msgspec.Meta(gt=0, le=36_500)] = 30.0
    max_rows: Annotated[int, msgspec.Meta(ge=1, le=1_000_000_000)] = 1_000_000
    purge_interval: Annotated[float, msgspec.Meta(ge=1, le=86_400)] = 60.0  # seconds
    # What a request's body and its answer keep each, redacted, cut at a character's end.
    max_body_bytes: Annotated[int, msgspec.Meta(ge=256, le=16 * MiB)] = 64 * 1024
