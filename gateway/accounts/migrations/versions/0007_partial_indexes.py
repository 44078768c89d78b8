"""The spend and request-log indexes by key and by team hold only the rows that have one.

A request without a virtual key (most of them, on a gateway with none) has no key and no team,
yet every one was written to these indexes under NULL, where no query looks: each query by key
or team compares the column (`=`, `IN`, `IS NOT NULL`), which the index's condition follows from,
so SQLite and PostgreSQL still use it.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# (index, table, its columns): the first column is the one a row may lack.
PARTIAL = (("spend_key_time", "spend", ["key_id", "time"]),
           ("spend_team_time", "spend", ["team", "time"]),
           ("request_log_key_time", "request_log", ["key_id", "time"]))


def upgrade() -> None:
    for name, table, columns in PARTIAL:
        present = sa.text(f"{columns[0]} IS NOT NULL")
        op.drop_index(name, table_name=table)
        op.create_index(name, table, columns, sqlite_where=present, postgresql_where=present)


def downgrade() -> None:
    raise NotImplementedError("the schema moves forward only")
