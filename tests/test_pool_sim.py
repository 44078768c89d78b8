"""bench/pool_sim.py at a tiny size: facts any correct simulator satisfies, whatever its numbers."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import pool_sim

POOL = pool_sim.PoolConfig(workers=3)
WORKLOAD = pool_sim.WorkloadConfig(requests=300, rate=9.0, seed=7)


@pytest.fixture(scope="module")
def requests() -> list[pool_sim.Request]:
    return pool_sim.make_workload(WORKLOAD)


@pytest.mark.parametrize("label", list(pool_sim.standard_policies()))
def test_every_request_completes_in_order(label: str, requests: list[pool_sim.Request]) -> None:
    pick = pool_sim.standard_policies()[label]()
    outcomes = pool_sim.simulate(requests, POOL, pick)
    for request, outcome in zip(requests, outcomes, strict=True):
        assert 0 <= outcome.worker < POOL.workers
        assert request.arrival <= outcome.admitted <= outcome.first_token <= outcome.done
        assert 0 <= outcome.cached <= len(request.hashes)
    result = pool_sim.summarize(label, WORKLOAD.rate, requests, outcomes, POOL)
    assert result.completed == result.requests == len(requests) == WORKLOAD.requests
    assert sum(result.served) == len(requests)
    assert 0.0 <= result.hit_rate <= 1.0
    assert 0.0 < result.busy <= 1.0
    assert result.ttft_p50 <= result.ttft_p99


def test_round_robin_spreads_evenly(requests: list[pool_sim.Request]) -> None:
    outcomes = pool_sim.simulate(requests, POOL, pool_sim.round_robin())
    result = pool_sim.summarize("rr", WORKLOAD.rate, requests, outcomes, POOL)
    assert max(result.served) - min(result.served) <= 1


def test_workload_is_deterministic_and_mixed(requests: list[pool_sim.Request]) -> None:
    assert pool_sim.make_workload(WORKLOAD) == requests
    assert {r.kind for r in requests} == {"chat", "system", "unique"}
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(requests))
    assert all(len(r.hashes) <= WORKLOAD.max_prompt_blocks for r in requests)
    assert 0.0 <= pool_sim.reuse_bound(requests) <= 1.0


def test_single_worker_chats_hit_after_the_first_turn() -> None:
    chats = pool_sim.make_workload(pool_sim.WorkloadConfig(
        requests=200, rate=2.0, seed=3, chat_share=1.0, system_share=0.0))
    # A cache that never evicts: then a later turn finds at least its predecessor's prompt.
    pool = pool_sim.PoolConfig(workers=1, cache_blocks=1_000_000)
    outcomes = pool_sim.simulate(chats, pool, pool_sim.prefix_affinity())
    later = [(r, o) for r, o in zip(chats, outcomes, strict=True) if r.turn > 0]
    assert later and all(r.kind == "chat" for r in chats)
    assert all(o.cached > 0 for _, o in later)
    assert all(not math.isnan(o.done) for o in outcomes)


def test_report_renders() -> None:
    report = pool_sim.study(POOL, WORKLOAD, sweep_rates=(WORKLOAD.rate,))
    text = pool_sim.document(report, "pool_sim.py")
    assert "## Method" in text and "ours (choose)" in text and "Policy sweep" in text
    assert "nan" not in text
