"""Keys, teams, spend, audit and the directory's revision.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("models", sa.JSON, nullable=True),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("max_parallel", sa.Integer, nullable=True),
        sa.Column("budget_usd", sa.Float, nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("last4", sa.String(4), nullable=False),
        sa.Column("team", sa.String(128), nullable=True),
        sa.Column("models", sa.JSON, nullable=True),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("max_parallel", sa.Integer, nullable=True),
        sa.Column("budget_usd", sa.Float, nullable=True),
        sa.Column("budget_period", sa.String(8), nullable=True),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("revoked_at", sa.Float, nullable=True),
        sa.Column("created_by", sa.String(128), nullable=True),
    )
    op.create_table(
        "spend",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(128), nullable=True),
        sa.Column("team", sa.String(128), nullable=True),
        sa.Column("alias", sa.String(256), nullable=True),
        sa.Column("provider", sa.String(128), nullable=True),
        sa.Column("upstream_model", sa.String(256), nullable=True),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("cached_tokens", sa.Integer, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("status", sa.Integer, nullable=False),
    )
    op.create_index("spend_time", "spend", ["time"])
    op.create_index("spend_key_time", "spend", ["key_id", "time"])
    op.create_index("spend_team_time", "spend", ["team", "time"])
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(256), nullable=False),
        sa.Column("change", sa.JSON, nullable=True),
    )
    op.create_index("audit_time", "audit", ["time"])
    revision_table = op.create_table(
        "revision",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
    )
    op.bulk_insert(revision_table, [{"id": 1, "value": 0}])


def downgrade() -> None:
    raise NotImplementedError("the accounts schema moves forward only")
