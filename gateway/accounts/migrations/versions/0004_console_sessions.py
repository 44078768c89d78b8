"""The console's sessions (`gateway.accounts.sessions`): one row per sign-in, so a sign-out
holds on every worker and replica that shares the database.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(64), primary_key=True),  # SHA-256 of the cookie, hex
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("teams", sa.JSON, nullable=True),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("via", sa.String(8), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
    )
    op.create_index("console_sessions_expires", "console_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("console_sessions")
