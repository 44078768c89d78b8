"""The accounts part: req/s with a virtual key under a budget against a static key, in turn on
the same gateway, on SQLite and on PostgreSQL.

One gateway on core 0 per database, the upstream and the load generator on core 1. The static
key is a line of `server.api_keys`; the virtual key is made through `POST /admin/keys` with a
monthly budget far above what the run spends, so every request of it is looked up in the
directory, rate-counted, held against its budget and settled, and both keys' requests are
written to the spend table. The two keys alternate round by round, each round starting with the
other one. PostgreSQL runs from its binaries in a temporary directory (skipped without them).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import (
    BENCH,
    PY,
    ROOT,
    STATIC_KEY,
    free_port,
    provider,
    spawn,
    stop,
    wait_for_port,
)

sys.path.insert(0, str(ROOT))
from tests.postgres_server import PostgresServer

CLIENTS = 50
PRICE = {"input": 1.0, "output": 2.0}


def _config(path: Path, upstream_port: int, database: str) -> None:
    models = {"bench-model": {"id": "bench-upstream-model", "price": PRICE}}
    path.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "api_keys": [STATIC_KEY]},
        "database": {"url": database},
        "providers": {"fake": provider(upstream_port, models=models)},
    }))


def _virtual_key(port: int) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/keys", method="POST",
        data=json.dumps({"name": "bench", "budget": {"usd": 1e6, "period": "month"}}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(json.load(answer)["key"])


def accounts_cost(work: Path, duration: float, rounds: int,
                  measure: Callable[[str, str, float], float]) -> dict[str, Any]:
    """`rounds` of the two keys in turn per database; `measure(url, key, seconds)`: req/s."""
    results: dict[str, Any] = {"clients": CLIENTS}
    databases: list[tuple[str, Callable[[], tuple[str, Callable[[], None]]]]] = [
        ("sqlite", lambda: (f"sqlite:///{tempfile.mkdtemp(dir=work)}/bench.db", lambda: None))]
    if PostgresServer.available():
        def postgres() -> tuple[str, Callable[[], None]]:
            server = PostgresServer().start()
            return server.url, server.close
        databases.append(("postgresql", postgres))
    for name, open_database in databases:
        url, close = open_database()
        try:
            results[name] = _one(work, name, url, duration, rounds, measure)
        finally:
            close()
    return results


def _one(work: Path, name: str, database: str, duration: float, rounds: int,
         measure: Callable[[str, str, float], float]) -> dict[str, Any]:
    upstream_port, port = free_port(), free_port()
    config = work / f"llms-accounts-{name}.json"
    _config(config, upstream_port, database)
    processes = [spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port)], 1,
                       work / f"upstream-accounts-{name}.log")]
    try:
        wait_for_port(upstream_port, processes[0])
        processes.append(spawn([PY, "-m", "gateway", "serve", "--config", str(config),
                                "--port", str(port)], 0, work / f"gateway-accounts-{name}.log",
                               cwd=ROOT))
        wait_for_port(port, processes[-1])
        keys = {"static": STATIC_KEY, "virtual": _virtual_key(port)}
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        rows = []
        for turn in range(rounds):
            order = list(keys) if turn % 2 == 0 else list(reversed(keys))
            row = {side: measure(url, keys[side], duration) for side in order}
            rows.append({**row, "ratio": row["virtual"] / row["static"]})
            print(f"  accounts ({name}): static key {row['static']:,.0f}  virtual key with a "
                  f"budget {row['virtual']:,.0f} req/s", flush=True)
    finally:
        for process in processes:
            stop(process)
    return {"rounds": rows, "ratio_median": statistics.median(r["ratio"] for r in rows)}


def rows(data: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """The target per database, as `run.figures` lists them."""
    if data is None:
        return [("non-streaming req/s: a virtual key with a budget against a static key",
                 "≥ 0.90x", "not measured", None)]
    found = []
    for name in ("sqlite", "postgresql"):
        if name not in data:
            continue
        ratios = sorted(r["ratio"] for r in data[name]["rounds"])
        median = float(statistics.median(ratios))
        found.append((f"non-streaming req/s, {data['clients']} clients: a virtual key with a "
                      f"budget against a static key ({name})", "≥ 0.90x",
                      f"{median:.2f}x: median of {len(ratios)} rounds "
                      f"({', '.join(f'{r:.2f}' for r in ratios)})", median >= 0.9))
    return found
