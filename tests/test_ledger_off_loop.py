"""Two workers of one machine share their budgets' counts in a file taken in turns: while that
file is held (another worker's turn, a backup, an operator's sqlite3 shell), the workers go on
answering everything else, and a budgeted request waits only so long before it is counted by its
worker alone."""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.gateway_process import GatewayProcess, wait_until
from tests.test_teams import Admin, chat, keyed_everywhere, priced
from tests.upstream import FakeUpstream


def test_a_held_budgets_file_never_stops_a_worker_answering_others(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    upstream = upstream_factory("billing")
    database = f"sqlite:///{tmp_path / 'state' / 'llms-gateway' / 'gateway.db'}"
    gateway = start_gateway(priced(upstream, "m", database={"url": database}),
                            extra_args=("--workers", "2"))
    secret = Admin(gateway).key(budget={"usd": 5.0, "period": "month"})["key"]
    keyed_everywhere(gateway)
    locks = list((tmp_path / "state").rglob("budgets-*.sqlite3.lock"))
    assert len(locks) == 1, locks

    held = os.open(locks[0], os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process holds the workers' file
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            # Budgeted requests on both workers wait for the file...
            budgeted = [pool.submit(chat, gateway, secret) for _ in range(8)]
            # ... while each worker keeps answering others, the file still held.
            healthy = [httpx.get(f"{gateway.url}/health", timeout=15).status_code
                       for _ in range(20)]
            still_waiting = sum(not b.done() for b in budgeted)
            answers = [b.result().status_code for b in budgeted]
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        os.close(held)

    assert healthy == [200] * 20
    assert still_waiting > 0, "the budgeted requests were waiting on the file meanwhile"
    # Each was counted by its own worker once the file stayed held, and served.
    assert answers == [200] * 8
    assert wait_until(lambda: chat(gateway, secret).status_code == 200, within=10)
