"""Alembic's scripts for the accounts schema: forward only, run at start (`database.migrate`)."""
