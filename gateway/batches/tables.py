"""The batches schema, as SQLAlchemy Core tables (`migrations/versions/0002_batches.py` builds
it): files as uploaded or produced, batches, and each batch request with its result.

A request's result is written once, by the first process to finish it (`state` moves from
`pending` once); `held_by` and `held_until` say which process runs it and until when, so a request
whose process died is run again once its hold lapses.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
)

metadata = MetaData()

files = Table(
    "batch_files", metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),  # the key's id; "" when no key is configured
    Column("filename", String(256), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("content", LargeBinary, nullable=False),
    # Relayed to an upstream (`native`): its provider and its own id (none where the upstream
    # keeps no files, Anthropic's: the content stays here).
    Column("provider", String(128), nullable=True),
    Column("upstream_id", String(128), nullable=True),
    Index("batch_files_owner", "owner", "created_at"),
)

batches = Table(
    "batches", metadata,
    Column("id", String(64), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("metadata", JSON, nullable=True),
    Column("errors", JSON, nullable=True),  # validation errors: [{code, line, message, param}]
    Column("model", String(256), nullable=True),
    Column("output_file_id", String(64), nullable=True),
    Column("error_file_id", String(64), nullable=True),
    Column("total", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("in_progress_at", Float, nullable=True),
    Column("finalizing_at", Float, nullable=True),
    Column("completed_at", Float, nullable=True),
    Column("failed_at", Float, nullable=True),
    Column("expired_at", Float, nullable=True),
    Column("cancelling_at", Float, nullable=True),
    Column("cancelled_at", Float, nullable=True),
    Column("provider", String(128), nullable=True),  # relayed (`native`): where it runs
    Column("upstream_id", String(128), nullable=True),
    Index("batches_owner", "owner", "created_at"),
    Index("batches_status", "status"),
)

requests = Table(
    "batch_requests", metadata,
    Column("batch_id", String(64), primary_key=True),
    Column("line", Integer, primary_key=True),  # 1-based, as the input file's line
    Column("custom_id", String(512), nullable=False),
    Column("body", LargeBinary, nullable=False),
    Column("state", String(16), nullable=False),  # pending, completed, failed
    Column("result", LargeBinary, nullable=True),  # its line of the output or error file
    Column("input_tokens", Integer, nullable=True),
    Column("output_tokens", Integer, nullable=True),
    Column("tries", Integer, nullable=False, default=0),  # failures it was retried after
    Column("held_by", String(64), nullable=True),
    Column("held_until", Float, nullable=True),
    Index("batch_requests_state", "batch_id", "state"),
)
