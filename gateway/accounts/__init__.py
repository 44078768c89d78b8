"""Teams: virtual keys, teams, budgets and spend, kept in a database (SQLAlchemy + Alembic).

The database is the record (`database.py`, `tables.py`, `migrations/`); the hot path reads only
memory: the directory of keys and teams (`directory.py`), refreshed when an admin changes them,
and the budget ledger (`ledger.py`: this process, or Redis shared by all), where a request
reserves its worst-case cost before it is sent and settles to what it really cost when it ends
(`budgets.py`). Every request's spend is written in batches, off the request path (`spend.py`).
"""
