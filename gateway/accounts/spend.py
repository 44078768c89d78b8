"""A spend row: one request's record as the `spend` table keeps it, a plain tuple until it is
written."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any, NamedTuple


class SpendRow(NamedTuple):
    """One request's row of the `spend` table, its fields in the insert's order. The upstream
    model comes last: it is looked up when the row is written, and added to the plain tuple the
    request left (`Accounts.ended`)."""

    time: float
    day: str
    request_id: str
    key_id: str | None
    team: str | None
    alias: str | None
    provider: str | None
    endpoint: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost: float
    latency_ms: float
    status: int
    upstream_model: str | None


def spend_row(**fields: Any) -> SpendRow:
    """A spend row, its `day` filled from its `time`."""
    return SpendRow(**fields, day=utc_day(fields["time"]))


@functools.lru_cache(maxsize=4)
def _day(number: int) -> str:
    return dt.datetime.fromtimestamp(number * 86400, dt.UTC).strftime("%Y-%m-%d")


def utc_day(at: float) -> str:
    """The UTC date of a time, worked out once a day rather than once a request."""
    return _day(int(at // 86400))
