"""Instructions per spend row as SQLite inserts it, by the way the rows are handed over.

    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \
        --callgrind-out-file=/tmp/cg.%p .venv/bin/python bench/spend_rows.py [--out /tmp/cg.%p] \
        [--way executemany|values] [--rows-per 64] [--partial] [--plain-binds] [--batches 10]

The `spend` table as the migrations build it (`gateway.accounts.tables`; its key and team
indexes partial with `--partial`, else whole, as before migration 0007), in a SQLite file with
the gateway's pragmas, filled with `--prefill` earlier rows; then `--batches` transactions of
`--batch` rows a plain request leaves (no key, no team), counted by callgrind
(`bench/callgrind.py`'s switch): `executemany` of one row's insert, or `values`, a statement of
`--rows-per` rows. `--plain-binds` registers an adapter for None, as
`gateway.requestlog.store.plain_binds` does.
"""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import tempfile
from itertools import chain
from pathlib import Path

import callgrind  # run by path, bench/ is on sys.path
from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from gateway.accounts.spend import SpendRow
from gateway.accounts.tables import spend


def schema(partial: bool) -> list[str]:
    """The spend table's DDL as SQLite is given it; its key and team indexes partial or whole."""
    dialect = sqlite.dialect()
    ddl = [str(CreateTable(spend).compile(dialect=dialect))]
    for index in sorted(spend.indexes, key=lambda i: str(i.name)):
        statement = str(CreateIndex(index).compile(dialect=dialect)).split(" WHERE ")[0]
        first = next(iter(index.columns)).name
        if partial and first in ("key_id", "team"):
            statement += f" WHERE {first} IS NOT NULL"
        ddl.append(statement)
    return ddl


def rows(start: int, count: int, at: float) -> list[tuple[object, ...]]:
    return [(at + n * 0.001, "2026-12-07", f"req-{start + n:012d}", None, None, "bench-model",
             "fake", "chat/completions", 12, 16, 0, 0.0, 1.5, 200, "bench-model")
            for n in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--way", choices=("executemany", "values"), default="executemany")
    parser.add_argument("--rows-per", type=int, default=64)
    parser.add_argument("--partial", action="store_true")
    parser.add_argument("--plain-binds", action="store_true")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--show", action="store_true", help="print the DDL")
    parser.add_argument("--prefill", type=int, default=50_000)
    parser.add_argument("--out", default="/tmp/cg.%p",
                        help="valgrind's --callgrind-out-file, %%p for the pid")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="llms-spend-rows-"))
    conn = sqlite3.connect(folder / "spend.db", isolation_level=None)
    for pragma in ("journal_mode=WAL", "busy_timeout=5000", "synchronous=NORMAL",
                   "temp_store=MEMORY"):
        conn.execute(f"PRAGMA {pragma}")
    for statement in schema(args.partial):
        if args.show:
            print(statement)
        conn.execute(statement)
    if args.plain_binds:
        sqlite3.register_adapter(type(None), lambda _: None)
    names = ", ".join(SpendRow._fields)
    one = f"({', '.join('?' * len(SpendRow._fields))})"
    single = f"INSERT INTO spend ({names}) VALUES {one}"
    conn.execute("BEGIN")
    conn.executemany(single, rows(0, args.prefill, 1.7e9))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    batches = [rows(args.prefill + b * args.batch, args.batch, 1.8e9 + b)
               for b in range(args.batches)]
    per = args.rows_per
    multi = f"INSERT INTO spend ({names}) VALUES {', '.join([one] * per)}"

    def write(batch: list[tuple[object, ...]]) -> None:
        conn.execute("BEGIN")
        if args.way == "executemany":
            conn.executemany(single, batch)
        else:
            whole = len(batch) - len(batch) % per
            if whole:
                conn.executemany(multi, [tuple(chain.from_iterable(batch[s:s + per]))
                                         for s in range(0, whole, per)])
            if whole < len(batch):
                rest = batch[whole:]
                conn.execute(f"INSERT INTO spend ({names}) VALUES {', '.join([one] * len(rest))}",
                             tuple(chain.from_iterable(rest)))
        conn.execute("COMMIT")

    write(rows(10**9, args.batch, 1.75e9))  # the statements prepared and cached
    lib = callgrind.switch()
    lib.cg_start()
    for batch in batches:
        write(batch)
    lib.cg_stop()
    conn.close()
    first = Path(args.out.replace("%p", str(os.getpid())))
    out = next((p for p in sorted(first.parent.glob(first.name + "*"))
                if "measured" in p.read_text(errors="replace")), None)
    if out is None:
        raise SystemExit("no callgrind output: run under valgrind --tool=callgrind (see --help)")
    total = int(re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)[1])
    print(f"{args.way} rows_per={per} partial={args.partial} plain={args.plain_binds}: "
          f"{total / (args.batch * args.batches):,.0f} instructions a row")


if __name__ == "__main__":
    main()
