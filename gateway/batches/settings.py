"""The `batches` section of llms.json: how large an input file may be, how many of a batch's
requests run at once, how a process holds the requests it runs."""

from __future__ import annotations

from typing import Annotated

import msgspec

MiB = 1024 * 1024


class BatchesConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bounds of `/v1/files` uploads and of the batch runner (`gateway.batches.runner`)."""

    # An uploaded file is kept in the database: its size, its lines and each line are bounded.
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1024 * MiB)] = 64 * MiB
    max_lines: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 50_000
    max_line_bytes: Annotated[int, msgspec.Meta(ge=256, le=64 * MiB)] = 4 * MiB
    # A batch's requests in flight at once, per process, over every batch.
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 4
    # Seconds between two looks at the database for work (a new batch, a cancel elsewhere).
    poll_interval: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0
    # Seconds a process holds a request it runs, renewed while it runs: a request held by a
    # process that died is run again once its hold lapses (its result is kept once).
    lease: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 30.0
