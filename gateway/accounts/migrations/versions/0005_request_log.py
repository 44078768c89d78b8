"""The request log (`gateway.requestlog.tables`), and what each key's requests keep in it.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("keys", sa.Column("logs", sa.JSON, nullable=True))
    op.create_table(
        "request_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(128), nullable=True),
        sa.Column("team", sa.String(128), nullable=True),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("requested", sa.String(256), nullable=True),
        sa.Column("alias", sa.String(256), nullable=True),
        sa.Column("model", sa.String(256), nullable=True),
        sa.Column("provider", sa.String(128), nullable=True),
        sa.Column("stream", sa.Boolean, nullable=False),
        sa.Column("attempts", sa.Text, nullable=False),
        sa.Column("hedged", sa.Boolean, nullable=False),
        sa.Column("hedge_won", sa.Boolean, nullable=False),
        sa.Column("cache_hit", sa.Boolean, nullable=False),
        sa.Column("replayed", sa.Boolean, nullable=False),
        sa.Column("resumed", sa.Integer, nullable=False),
        sa.Column("guardrails", sa.Text, nullable=False),
        sa.Column("ttft_ms", sa.Float, nullable=True),
        sa.Column("duration_ms", sa.Float, nullable=False),
        sa.Column("overhead_ms", sa.Float, nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=True),
        sa.Column("completion_tokens", sa.Integer, nullable=True),
        sa.Column("cached_tokens", sa.Integer, nullable=True),
        sa.Column("cache_write_tokens", sa.Integer, nullable=True),
        sa.Column("cost", sa.Float, nullable=True),
        sa.Column("status", sa.Integer, nullable=False),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("payload", sa.String(16), nullable=False),
        sa.Column("request_body", sa.Text, nullable=True),
        sa.Column("response_body", sa.Text, nullable=True),
    )
    op.create_index("request_log_time", "request_log", ["time", "id"])
    op.create_index("request_log_key_time", "request_log", ["key_id", "time"])
    op.create_index("request_log_request_id", "request_log", ["request_id"])


def downgrade() -> None:
    raise NotImplementedError("the schema moves forward only")
