"""MCP tool allow-lists on keys and teams (`gateway.mcp.allowed`): null, every tool.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("keys") as table:
        table.add_column(sa.Column("mcp_tools", sa.JSON, nullable=True))
    with op.batch_alter_table("teams") as table:
        table.add_column(sa.Column("mcp_tools", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("keys") as table:
        table.drop_column("mcp_tools")
    with op.batch_alter_table("teams") as table:
        table.drop_column("mcp_tools")
