"""The accounts schema, as SQLAlchemy Core tables (the migrations in `migrations/` build it).

Times are seconds since the epoch (floats), so every database compares them the same way; a
spend row also carries its UTC day, for grouping by day without a dialect's date functions.
"""

from __future__ import annotations

from sqlalchemy import JSON, Column, Float, Index, Integer, MetaData, String, Table, text

metadata = MetaData()

teams = Table(
    "teams", metadata,
    Column("name", String(128), primary_key=True),
    Column("models", JSON, nullable=True),  # aliases its keys may use; null: any
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("max_parallel", Integer, nullable=True),
    Column("budget_usd", Float, nullable=True),
    Column("budget_period", String(8), nullable=True),
    Column("metadata", JSON, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("guardrails", JSON, nullable=True),  # llms.json's guardrails its keys pass
    Column("mcp_tools", JSON, nullable=True),  # MCP tools its keys may call; null: any
)

keys = Table(
    "keys", metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(128), nullable=False),
    Column("hash", String(64), nullable=False, unique=True),  # SHA-256 of the key, hex
    Column("prefix", String(16), nullable=False),
    Column("last4", String(4), nullable=False),
    Column("team", String(128), nullable=True),
    Column("models", JSON, nullable=True),
    Column("rpm", Integer, nullable=True),
    Column("tpm", Integer, nullable=True),
    Column("max_parallel", Integer, nullable=True),
    Column("budget_usd", Float, nullable=True),
    Column("budget_period", String(8), nullable=True),
    Column("expires_at", Float, nullable=True),
    Column("metadata", JSON, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("revoked_at", Float, nullable=True),
    Column("created_by", String(128), nullable=True),
    Column("guardrails", JSON, nullable=True),  # llms.json's guardrails it passes
    Column("logs", JSON, nullable=True),  # {"capture": ...}: the request log's, for its requests
    Column("mcp_tools", JSON, nullable=True),  # MCP tools it may call (names, patterns)
)

spend = Table(
    "spend", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("day", String(10), nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("key_id", String(128), nullable=True),
    Column("team", String(128), nullable=True),
    Column("alias", String(256), nullable=True),
    Column("provider", String(128), nullable=True),
    Column("upstream_model", String(256), nullable=True),
    Column("endpoint", String(32), nullable=False),
    Column("prompt_tokens", Integer, nullable=False),
    Column("completion_tokens", Integer, nullable=False),
    Column("cached_tokens", Integer, nullable=False),
    Column("cost", Float, nullable=False),
    Column("latency_ms", Float, nullable=False),
    Column("status", Integer, nullable=False),
    Index("spend_time", "time"),
    # Partial: a row without a key (or team) is in no query by key (or team).
    Index("spend_key_time", "key_id", "time", sqlite_where=text("key_id IS NOT NULL"),
          postgresql_where=text("key_id IS NOT NULL")),
    Index("spend_team_time", "team", "time", sqlite_where=text("team IS NOT NULL"),
          postgresql_where=text("team IS NOT NULL")),
)

audit = Table(
    "audit", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("action", String(64), nullable=False),
    Column("target", String(256), nullable=False),
    Column("change", JSON, nullable=True),
    Index("audit_time", "time"),
)

# One row: bumped by every change to keys or teams, so each process (and replica) polls one
# number to learn its directory is stale.
revision = Table(
    "revision", metadata,
    Column("id", Integer, primary_key=True),
    Column("value", Integer, nullable=False),
)

# The console's sign-ins: the cookie's hash, never the cookie; a row ended or expired is refused.
console_sessions = Table(
    "console_sessions", metadata,
    Column("id", String(64), primary_key=True),
    Column("actor", String(256), nullable=False),  # the person's email, else their `sub`
    Column("role", String(16), nullable=False),  # admin, viewer, team_admin
    Column("teams", JSON, nullable=True),  # a team admin's teams
    Column("csrf", String(64), nullable=False),  # what a write from this session must carry
    Column("via", String(8), nullable=False),  # "oidc" or "key"
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("ended_at", Float, nullable=True),
    Index("console_sessions_expires", "expires_at"),
)
