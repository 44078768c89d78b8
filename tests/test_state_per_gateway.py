"""State belongs to a gateway, not to the user who runs it: two checkouts (or two configs) on
one machine, under one user, keep separate keys, spend and pool workers."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.config.loader import users_state_dir
from tests.fake_gpu import install_fakes
from tests.gateway_process import GatewayProcess, config, free_port
from tests.pool_helpers import wait_for_workers, workers
from tests.test_teams import MESSAGES, Admin, priced
from tests.upstream import FakeUpstream

MODEL = "qwen3-8b"


@pytest.fixture
def one_user(tmp_path: Path) -> dict[str, str]:
    """The environment of one user of the machine: every gateway started with it shares the
    user's state home, as two checkouts in a home directory would."""
    return {"XDG_STATE_HOME": str(tmp_path / "home-state")}


def started(folder: Path, doc: dict[str, object], env: dict[str, str]) -> GatewayProcess:
    folder.mkdir(parents=True)
    return GatewayProcess(folder, doc, env=env).start()


def test_a_key_made_for_one_gateway_does_not_lock_another_of_the_same_user(
        tmp_path: Path, one_user: dict[str, str], upstream: FakeUpstream) -> None:
    first = started(tmp_path / "checkout-a", priced(upstream, "m"), one_user)
    second = started(tmp_path / "checkout-b", priced(upstream, "m"), one_user)
    try:
        Admin(first).key(name="first-only")

        ask = {"model": "m", "messages": MESSAGES, "max_tokens": 8}
        assert httpx.post(f"{first.base_url}/chat/completions", json=ask,
                          timeout=10).status_code == 401
        assert httpx.post(f"{second.base_url}/chat/completions", json=ask,
                          timeout=10).status_code == 200
        assert Admin(second).call("GET", "/admin/keys").json()["data"] == []
        folders = sorted(p.name for p in users_state_dir(one_user).iterdir())
        assert len(folders) == 2 and [f.split("-")[0] for f in folders] == ["checkout", "checkout"]
        for gateway in (first, second):
            assert "its state in " in gateway.logs()
    finally:
        first.stop()
        second.stop()


def test_an_earlier_version_s_shared_database_is_named_not_silently_used(
        tmp_path: Path, one_user: dict[str, str], upstream: FakeUpstream) -> None:
    earlier = users_state_dir(one_user) / "gateway.db"
    earlier.parent.mkdir(parents=True)
    sqlite3.connect(earlier).close()

    gateway = started(tmp_path / "checkout", priced(upstream, "m"), one_user)
    try:
        assert f"stays at {earlier}" in gateway.logs()
    finally:
        gateway.stop()


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="state") as fake:
        yield fake


def test_a_second_gateway_never_drives_the_first_one_s_pool_workers(
        tmp_path: Path, one_user: dict[str, str]) -> None:
    fakes = {**one_user, **install_fakes(tmp_path / "bin", gpus=1)}
    port = free_port()
    entry = {"type": "pool", "engine": "auto", "port": port, "check_interval": 0.2,
             "restart_backoff": 0.2, "shutdown_grace": 3,
             "models": {MODEL: {"source": "Qwen/Qwen3-8B", "max_model_len": 4096}}}
    doc = config({"local": entry}, defaults={"circuit": {"enabled": False}})
    first = started(tmp_path / "a", doc, fakes)
    try:
        wait_for_workers(first, "ready")
        second = started(tmp_path / "b", doc, fakes)
        try:
            (failed,) = wait_for_workers(second, "failed")
            assert f"port {port}" in failed["last_error"] and "in use" in failed["last_error"]
            answer = httpx.post(f"{second.base_url}/chat/completions", timeout=20, json={
                "model": MODEL, "messages": MESSAGES})
            assert answer.status_code != 200, "served by the first gateway's worker"
            assert [w["state"] for w in workers(first)] == ["ready"]
        finally:
            second.stop()
    finally:
        first.stop()
