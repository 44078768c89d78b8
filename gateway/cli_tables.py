"""What `keys`, `teams` and `spend` print: tables and CSV from the admin API's JSON."""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns, each as wide as its widest cell."""
    cells = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                      ).rstrip() for row in cells]


def budget_text(budget: dict[str, Any] | None) -> str:
    """`$20/month`, or `-` for none."""
    if not budget:
        return "-"
    return f"${budget['usd']:g}/{budget['period']}"


def _models_text(models: list[str] | None) -> str:
    return ",".join(models) if models is not None else "*"


def _day(iso: str | None) -> str:
    """An ISO time as its UTC date-time to the minute, or `-`."""
    if not iso:
        return "-"
    when = dt.datetime.fromisoformat(iso).astimezone(dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M")


def key_rows(keys: Iterable[dict[str, Any]]) -> list[str]:
    """`keys list`: one line per key, never its secret."""
    return table(("id", "name", "key", "team", "models", "budget", "expires", "revoked"),
                 [(k["id"], k["name"], k["key_hint"], k["team"] or "-",
                   _models_text(k["models"]), budget_text(k["budget"]), _day(k["expires_at"]),
                   _day(k["revoked_at"]) if k["revoked_at"] else "no") for k in keys])


def team_rows(teams: Iterable[dict[str, Any]]) -> list[str]:
    """`teams list`: one line per team."""
    def limit(value: int | None) -> str:
        return "-" if value is None else str(value)
    return table(("name", "models", "budget", "rpm", "tpm", "max parallel"),
                 [(t["name"], _models_text(t["models"]), budget_text(t["budget"]),
                   limit(t["rpm"]), limit(t["tpm"]), limit(t["max_parallel"])) for t in teams])


def spend_rows(rows: Sequence[dict[str, Any]], group_by: str) -> list[str]:
    """`spend`: one line per group and a total."""
    total = sum(float(r["cost"]) for r in rows)
    lines = table((group_by, "requests", "refused", "prompt tokens", "completion tokens",
                   "cached tokens", "cost ($)"),
                  [(str(r["group"]) if r["group"] is not None else "(none)",
                    str(r["requests"]), str(r.get("refused", 0)), str(r["prompt_tokens"]),
                    str(r["completion_tokens"]),
                    str(r.get("cached_tokens", 0)), f"{float(r['cost']):.6f}") for r in rows])
    return [*lines, f"total: ${total:.6f} over {sum(int(r['requests']) for r in rows)} requests"]


def spend_csv(rows: Iterable[dict[str, Any]], out: Any) -> None:
    """`spend --csv`: a header row, then the rows as the admin API gives them."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(SPEND_COLUMNS)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c, 0) for c in SPEND_COLUMNS])


SPEND_COLUMNS = ("group", "requests", "refused", "prompt_tokens", "completion_tokens",
                 "cached_tokens", "cost")
