"""The request log's table, as SQLAlchemy Core (`accounts/migrations/versions/0005_request_log.py`
builds it; 0007 its key index partial).

A row is one request as it ended. Times are seconds since the epoch (floats), as the spend
table's; the attempts and guardrail actions are JSON text, written as the driver takes them
(`store.Store.write`) and decoded when read. `model` is the upstream model that served, as the
spend table's `upstream_model`; `requested` is the name the client sent.
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text, text

metadata = MetaData()

request_log = Table(
    "request_log", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("key_id", String(128), nullable=True),
    Column("team", String(128), nullable=True),
    Column("endpoint", String(32), nullable=False),
    Column("requested", String(256), nullable=True),
    Column("alias", String(256), nullable=True),
    Column("model", String(256), nullable=True),
    Column("provider", String(128), nullable=True),
    Column("stream", Boolean, nullable=False),
    Column("attempts", Text, nullable=False),  # JSON: [{provider, status, reason, outcome}]
    Column("hedged", Boolean, nullable=False),
    Column("hedge_won", Boolean, nullable=False),  # the hedge, not the first try, answered
    Column("cache_hit", Boolean, nullable=False),
    Column("replayed", Boolean, nullable=False),
    Column("resumed", Integer, nullable=False),
    Column("guardrails", Text, nullable=False),  # JSON: a list of strings
    Column("ttft_ms", Float, nullable=True),
    Column("duration_ms", Float, nullable=False),
    Column("overhead_ms", Float, nullable=True),
    Column("prompt_tokens", Integer, nullable=True),
    Column("completion_tokens", Integer, nullable=True),
    Column("cached_tokens", Integer, nullable=True),
    Column("cache_write_tokens", Integer, nullable=True),
    Column("cost", Float, nullable=True),
    Column("status", Integer, nullable=False),
    Column("error_code", String(64), nullable=True),
    Column("outcome", String(32), nullable=False),
    Column("payload", String(16), nullable=False),  # disabled, not_captured, stored
    Column("request_body", Text, nullable=True),
    Column("response_body", Text, nullable=True),
    Index("request_log_time", "time", "id"),
    Index("request_log_key_time", "key_id", "time",  # a row without a key: in no query by key
          sqlite_where=text("key_id IS NOT NULL"), postgresql_where=text("key_id IS NOT NULL")),
    Index("request_log_request_id", "request_id"),
)
