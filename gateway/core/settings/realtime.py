"""The Realtime API's settings (`realtime` in llms.json, `gateway.realtime`)."""

from __future__ import annotations

from typing import Annotated

import msgspec

MiB = 1024 * 1024


class RealtimeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bounds of a Realtime session (`/v1/realtime`, `gateway.realtime`)."""

    # The largest frame either side may send (OpenAI caps an audio append at 15 MiB of base64);
    # the ASGI server's own cap is 64 MiB.
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024, le=64 * MiB)] = 8 * MiB
    # Seconds with no frame either way before the session is ended.
    idle_timeout: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 300.0
    # Seconds a session may last at most (OpenAI ends its own at 30 or 60 minutes).
    max_session_seconds: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 3600.0
    # Sessions open at once per key (an open gateway's callers share one count), per process;
    # and over every key.
    max_sessions_per_key: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 10
    max_sessions: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 1_000
