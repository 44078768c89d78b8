"""Keys and teams name the guardrails of llms.json they pass (`gateway.guardrails`).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("keys", sa.Column("guardrails", sa.JSON, nullable=True))
    op.add_column("teams", sa.Column("guardrails", sa.JSON, nullable=True))


def downgrade() -> None:
    raise NotImplementedError("the schema moves forward only")
