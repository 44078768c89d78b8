"""What every store on the accounts database shares: its transactions, and inserts written in
the driver's own placeholders."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.core.errors import DatabaseUnavailable


@contextlib.asynccontextmanager
async def transaction(engine: AsyncEngine, name: str) -> AsyncIterator[AsyncConnection]:
    """A transaction on `engine`; any database failure leaves as `DatabaseUnavailable`, saying
    whose database (`name`) it was."""
    try:
        async with engine.begin() as conn:
            yield conn
    except (DBAPIError, SQLAlchemyError, OSError) as exc:
        raise DatabaseUnavailable(f"The {name} database is unavailable "
                                  f"({type(exc).__name__})") from exc


def insert(table: str, names: Sequence[str], paramstyle: str) -> str:
    """`table`'s insert of `names` in the driver's own placeholders (`?` for sqlite3, `$1` for
    asyncpg): rows handed to the driver as tuples, with no SQLAlchemy statement per batch."""
    marks = ["?"] * len(names) if paramstyle == "qmark" \
        else [f"${n}" for n in range(1, len(names) + 1)] if paramstyle == "numeric_dollar" \
        else ["%s"] * len(names)
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(marks)})"
