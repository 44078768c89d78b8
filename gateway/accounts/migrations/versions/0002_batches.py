"""Files, batches and each batch request with its result (`gateway.batches.tables`).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("filename", sa.String(256), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("provider", sa.String(128), nullable=True),
        sa.Column("upstream_id", sa.String(128), nullable=True),
    )
    op.create_index("batch_files_owner", "batch_files", ["owner", "created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("errors", sa.JSON, nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("in_progress_at", sa.Float, nullable=True),
        sa.Column("finalizing_at", sa.Float, nullable=True),
        sa.Column("completed_at", sa.Float, nullable=True),
        sa.Column("failed_at", sa.Float, nullable=True),
        sa.Column("expired_at", sa.Float, nullable=True),
        sa.Column("cancelling_at", sa.Float, nullable=True),
        sa.Column("cancelled_at", sa.Float, nullable=True),
        sa.Column("provider", sa.String(128), nullable=True),
        sa.Column("upstream_id", sa.String(128), nullable=True),
    )
    op.create_index("batches_owner", "batches", ["owner", "created_at"])
    op.create_index("batches_status", "batches", ["status"])
    op.create_table(
        "batch_requests",
        sa.Column("batch_id", sa.String(64), primary_key=True),
        sa.Column("line", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("result", sa.LargeBinary, nullable=True),
        sa.Column("input_tokens", sa.Integer, nullable=True),
        sa.Column("output_tokens", sa.Integer, nullable=True),
        sa.Column("tries", sa.Integer, nullable=False, server_default="0"),
        sa.Column("held_by", sa.String(64), nullable=True),
        sa.Column("held_until", sa.Float, nullable=True),
    )
    op.create_index("batch_requests_state", "batch_requests", ["batch_id", "state"])


def downgrade() -> None:
    raise NotImplementedError("the schema moves forward only")
