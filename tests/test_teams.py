"""Teams share a gateway: keys made at runtime, budgets held before the money is spent, spend
per key in the database (SQLite here; `test_teams_postgres.py` runs the stories that need
replicas on PostgreSQL).

Every story is a real client through a real socket: the admin API creates keys and teams, the
OpenAI and Anthropic SDKs spend them against fake upstreams that bill real usage.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.accounts.database import engine_url
from gateway.config.loader import state_dir
from tests.gateway_process import ROOT, GatewayProcess, config, provider, wait_until
from tests.postgres_server import PostgresServer
from tests.upstream import FakeUpstream, held, ok, stream_cut

# Dollars per million tokens: a request of a few dozen tokens costs about a thousandth of a
# dollar, so a one-cent budget holds a handful of them.
PRICE = {"input": 20.0, "output": 40.0}
MESSAGES = [{"role": "user", "content": "hello"}]


def priced(upstream: FakeUpstream, *aliases: str, **extra: Any) -> dict[str, Any]:
    models = {alias: {"id": f"{alias}-upstream", "price": PRICE} for alias in aliases}
    return config({"main": provider(upstream.base_url, models)}, **extra)


class Admin:
    """The admin API as an operator's script calls it (from this machine, no admin key)."""

    def __init__(self, gateway: GatewayProcess, key: str | None = None) -> None:
        self.url = gateway.url
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.url}{path}", headers=self.headers, timeout=10,
                             **kwargs)

    def key(self, **body: Any) -> dict[str, Any]:
        made = self.call("POST", "/admin/keys", json={"name": "k", **body})
        assert made.status_code == 201, made.text
        return dict(made.json())

    def team(self, **body: Any) -> dict[str, Any]:
        made = self.call("POST", "/admin/teams", json=body)
        assert made.status_code == 201, made.text
        return dict(made.json())

    def spend(self, group_by: str = "key") -> dict[str, dict[str, Any]]:
        report = self.call("GET", f"/admin/spend?group_by={group_by}")
        assert report.status_code == 200, report.text
        return {row["group"]: row for row in report.json()["data"]}


def chat(gateway: GatewayProcess, key: str, model: str = "m", **extra: Any) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=20,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "messages": MESSAGES, "max_tokens": 8, **extra})


def keyed_everywhere(gateway: GatewayProcess) -> None:
    """Wait until every worker has read the directory since the first key was made: until then
    a worker that did not make it still serves as a gateway without keys (each reads it again
    within `database.poll_interval`). Ten anonymous requests in a row refused: each worker took
    some, whichever the kernel gave them to. They name no model, so none reaches an upstream."""
    def refused() -> bool:
        return all(httpx.post(f"{gateway.base_url}/chat/completions", timeout=5,
                              json={"model": "none", "messages": MESSAGES}).status_code == 401
                   for _ in range(10))
    wait_until(refused, within=5)


@pytest.fixture
def upstream(upstream_factory: Callable[[str], FakeUpstream]) -> FakeUpstream:
    return upstream_factory("billing")


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer | None]:
    """One PostgreSQL server for the module; each story gets a database of its own."""
    if not PostgresServer.available():
        yield None
        return
    server = PostgresServer().start()
    yield server
    server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path,
             postgres: PostgresServer | None) -> str:
    """Each story on SQLite (the default's own file) and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'llms-gateway' / 'gateway.db'}"
    if postgres is None:
        pytest.skip("PostgreSQL's binaries are not installed")
    return postgres.database(f"story_{os.urandom(6).hex()}")


def on(database: str) -> dict[str, Any]:
    return {"database": {"url": database}}


def rows(database: str, query: str) -> list[dict[str, Any]]:
    """What a table holds, read from the database itself (not through the gateway)."""
    async def read() -> list[dict[str, Any]]:
        engine = create_async_engine(engine_url(database))
        try:
            async with engine.connect() as conn:
                return [dict(r) for r in (await conn.execute(sa.text(query))).mappings()]
        finally:
            await engine.dispose()
    return asyncio.run(read())


def test_a_key_made_at_runtime_is_used_listed_without_its_secret_and_revoked(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)))
    admin = Admin(gateway)
    made = admin.key(name="alice-laptop", metadata={"owner": "alice"})
    secret = made["key"]
    assert secret.startswith("sk-llms-") and made["key_hint"].endswith(secret[-4:])

    client = openai.OpenAI(base_url=gateway.base_url, api_key=secret, max_retries=0)
    reply = client.chat.completions.with_raw_response.create(model="m", messages=MESSAGES)
    assert reply.parse().choices[0].message.content

    listed = admin.call("GET", "/admin/keys").text
    assert made["id"] in listed and secret not in listed
    stored = rows(database, "SELECT * FROM keys")
    assert len(stored) == 1 and secret not in str(stored)  # only its hash is kept
    if database.startswith("sqlite"):  # not in the file's free pages either
        assert secret.encode() not in Path(database.removeprefix("sqlite:///")).read_bytes()

    # Once a virtual key exists the gateway is no longer open to anyone.
    assert chat(gateway, "sk-llms-guessed").status_code == 401
    assert httpx.post(f"{gateway.base_url}/chat/completions",
                      json={"model": "m", "messages": MESSAGES}).status_code == 401

    assert admin.call("DELETE", f"/admin/keys/{made['id']}").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=MESSAGES)
    actions = [(a["action"], a["target"], a["actor"])
               for a in admin.call("GET", "/admin/audit").json()["data"]]
    assert ("key_revoked", made["id"], "local") in actions
    # A refused key spends nothing, and a flood of them writes no spend row.
    assert set(admin.spend()) == {made["id"]}
    assert ("key_created", made["id"], "local") in actions


def test_a_key_limited_to_one_alias_gets_403_for_any_other_known_or_not(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", "other", **on(database)))
    secret = Admin(gateway).key(models=["m"])["key"]
    assert chat(gateway, secret).status_code == 200
    for model in ("other", "no-such-model"):
        refused = chat(gateway, secret, model=model)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "model_not_allowed"
        assert refused.json()["error"]["param"] == "model"
    assert len(upstream.requests) == 1


def test_an_expired_key_is_refused(start_gateway: Callable[..., GatewayProcess],
                                   upstream: FakeUpstream, database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)))
    secret = Admin(gateway).key(expires_at="2020-01-01T00:00:00Z")["key"]
    refused = chat(gateway, secret)
    assert refused.status_code == 401 and "expired" in refused.json()["error"]["message"]


def test_an_expired_key_is_refused_on_every_route_that_acts_for_a_key(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    models = {"m": {"id": "m-upstream", "price": PRICE}}
    gateway = start_gateway(config(
        {"main": provider(upstream.base_url, models, passthrough=["/v1/models"])},
        **on(database)))
    admin = Admin(gateway)
    live, expired = admin.key()["key"], admin.key(expires_at="2020-01-01T00:00:00Z")["key"]
    keyed_everywhere(gateway)
    routes = [("GET", "/v1/models"), ("GET", "/v1/models/m"), ("GET", "/metrics"),
              ("GET", "/status.json"), ("GET", "/v1/files"), ("GET", "/v1/batches"),
              ("GET", "/v1/responses/resp_unknown"), ("GET", "/passthrough/main/v1/models")]

    for method, path in routes:
        answer = httpx.request(method, f"{gateway.url}{path}", timeout=10,
                               headers={"Authorization": f"Bearer {expired}"})
        assert answer.status_code == 401, (path, answer.text)
        assert "expired" in answer.json()["error"]["message"], path
    for method, path in routes:  # the same routes answer a key that has not expired
        answer = httpx.request(method, f"{gateway.url}{path}", timeout=10,
                               headers={"Authorization": f"Bearer {live}"})
        assert answer.status_code in (200, 404), (path, answer.text)
    ready = httpx.get(f"{gateway.url}/ready", headers={"Authorization": f"Bearer {expired}"})
    assert "providers" not in ready.json(), "no details for an expired key"


@pytest.mark.parametrize("workers", [1, 2], ids=["one worker", "two workers, no Redis"])
def test_fifty_concurrent_streams_never_overshoot_a_one_cent_budget(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        workers: int, database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)),
                            extra_args=("--workers", str(workers)))
    admin = Admin(gateway)
    made = admin.key(budget={"usd": 0.01, "period": "month"})
    keyed_everywhere(gateway)
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=made["key"], max_retries=0)

    async def one() -> str:
        try:
            stream = await client.chat.completions.create(
                model="m", messages=MESSAGES, max_tokens=8, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
        except openai.RateLimitError as exc:
            assert exc.code == "budget_exceeded" and made["id"] in exc.message
            return "refused"

    async def rounds() -> list[str]:
        results = []
        for _ in range(4):  # until the budget is gone: each round spends what it may
            results += await asyncio.gather(*(one() for _ in range(50)))
        return results

    results = asyncio.run(rounds())
    served = [r for r in results if r != "refused"]
    assert served and "refused" in results
    # Every worker writes its spend rows in the background, once a second when it is idle.
    wait_until(lambda: (admin.spend()[made["id"]]["requests"], admin.spend()[made["id"]][
        "refused"]) == (len(served), len(results) - len(served)), within=20)
    assert 0 < admin.spend()[made["id"]]["cost"] <= 0.01
    assert len(upstream.requests) == len(served)  # a refused request never reached it


def test_answers_carry_the_budget_left_and_a_spent_key_never_gets_another_answer(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)))
    secret = Admin(gateway).key(budget={"usd": 0.004, "period": "day"})["key"]
    left = []
    while (answer := chat(gateway, secret)).status_code == 200:
        left.append(float(answer.headers["x-llms-budget-remaining"]))
    assert left == sorted(left, reverse=True) and len(left) >= 2
    error = answer.json()["error"]
    assert answer.status_code == 429 and error["code"] == "budget_exceeded"
    assert "per day" in error["message"] and "resets" in error["message"]
    assert int(answer.headers["retry-after"]) <= 86400
    for _ in range(3):
        assert chat(gateway, secret).status_code == 429


def test_a_key_and_its_team_get_no_more_requests_in_flight_than_their_max_parallel(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)))
    admin = Admin(gateway)
    admin.team(name="ops", max_parallel=3)
    first = admin.key(name="a", team="ops", max_parallel=2)["key"]
    second = admin.key(name="b", team="ops")["key"]
    upstream.set_mode(held())
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = [pool.submit(chat, gateway, first) for _ in range(2)]
        wait_until(lambda: len(upstream.requests) == 2)
        refused = chat(gateway, first)  # the key's third at once
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "2 requests in flight" in refused.json()["error"]["message"]
        running.append(pool.submit(chat, gateway, second))  # the team's third
        wait_until(lambda: len(upstream.requests) == 3)
        refused = chat(gateway, second)  # the team's fourth, from a key with no limit of its own
        assert refused.status_code == 429 and "Team ops has 3" in refused.json()["error"]["message"]
        upstream.release()
        assert [done.result().status_code for done in running] == [200, 200, 200]
    assert chat(gateway, first).status_code == 200  # their slots came back when they ended
    assert chat(gateway, second).status_code == 200
    assert len(upstream.requests) == 5


def test_two_workers_of_one_machine_share_a_key_s_max_parallel(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)), extra_args=("--workers", "2"))
    secret = Admin(gateway).key(max_parallel=2)["key"]
    keyed_everywhere(gateway)
    upstream.set_mode(held())
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        # Whichever worker takes each request: two at the upstream at once, the rest refused.
        answers = [pool.submit(chat, gateway, secret) for _ in range(6)]
        wait_until(lambda: sum(a.done() for a in answers) == 4, within=10)
        assert len(upstream.requests) == 2
        upstream.release()
        statuses = sorted(a.result().status_code for a in answers)
    assert statuses == [200, 200, 429, 429, 429, 429]
    wait_until(lambda: chat(gateway, secret).status_code == 200, within=5)  # slots came back


def test_a_team_budget_caps_two_keys_together(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", **on(database)))
    admin = Admin(gateway)
    admin.team(name="research", budget={"usd": 0.004, "period": "month"})
    first, second = (admin.key(name=n, team="research")["key"] for n in ("a", "b"))
    served = 0
    for turn in range(40):
        answer = chat(gateway, first if turn % 2 else second)
        if answer.status_code != 200:
            assert answer.json()["error"]["code"] == "budget_exceeded"
            assert "team 'research'" in answer.json()["error"]["message"]
            break
        served += 1
    assert 2 <= served < 40
    assert admin.spend("team")["research"]["cost"] <= 0.004


def test_spend_by_key_and_by_model_adds_up_to_what_each_answer_cost(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", "other", **on(database)))
    admin = Admin(gateway)
    keys = [admin.key(name=f"k{i}") for i in range(2)]
    costs: dict[str, float] = {}
    for i in range(6):
        made = keys[i % 2]
        answer = chat(gateway, made["key"], model="m" if i < 4 else "other")
        costs[made["id"]] = costs.get(made["id"], 0.0) + float(answer.headers["x-llms-cost"])
    by_key = admin.spend("key")
    for key_id, cost in costs.items():
        assert by_key[key_id]["cost"] == pytest.approx(cost, abs=1e-6)
    by_model = admin.spend("model")
    assert by_model["m-upstream"]["requests"] == 4 and by_model["other-upstream"]["requests"] == 2
    assert sum(r["cost"] for r in by_model.values()) == pytest.approx(sum(costs.values()),
                                                                       abs=1e-6)


def test_every_endpoint_is_charged_and_a_cut_stream_too(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", "embed", **on(database)))
    admin = Admin(gateway)
    made = admin.key(budget={"usd": 5.0, "period": "total"})
    secret, headers = made["key"], {"Authorization": f"Bearer {made['key']}"}
    client = openai.OpenAI(base_url=gateway.base_url, api_key=secret, max_retries=0)
    client.responses.create(model="m", input="hello", max_output_tokens=8)
    client.embeddings.create(model="embed", input=["one", "two"])
    client.completions.create(model="m", prompt="hello", max_tokens=8)
    messages = anthropic.Anthropic(base_url=gateway.url, api_key=secret, max_retries=0)
    messages.messages.create(model="m", max_tokens=8, messages=[
        {"role": "user", "content": "hello"}])

    upstream.set_mode(stream_cut(after_chunks=3))
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", headers=headers,
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as cut:
        assert b"error" in b"".join(cut.iter_bytes())
    upstream.set_mode(ok())

    Admin(gateway).spend()  # the gateway writes what it holds before it answers
    charged = {row["endpoint"]: row["cost"] for row in rows(
        database, f"SELECT * FROM spend WHERE key_id = '{made['id']}'")}
    assert set(charged) == {"responses", "embeddings", "completions", "messages",
                            "chat/completions"}
    assert all(cost > 0 for cost in charged.values()), charged


def test_a_second_replica_refuses_a_revoked_key_within_a_second(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    doc = priced(upstream, "m", **on(database))
    first = start_gateway(doc)
    second = start_gateway(doc)  # another replica on the same database
    made = Admin(first).key()
    wait_until(lambda: chat(second, made["key"]).status_code == 200, within=2)
    Admin(first).call("DELETE", f"/admin/keys/{made['id']}")
    wait_until(lambda: chat(second, made["key"]).status_code == 401, within=1.5)
    audit = Admin(second).call("GET", "/admin/audit").json()["data"]
    assert [a["action"] for a in audit[:2]] == ["key_revoked", "key_created"]


def test_admin_routes_check_what_they_are_sent_and_who_sends_it(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(config({"main": provider(upstream.base_url, {"m": "m"})},
                                   server={"admin_keys": ["admin-secret-1"],
                                           "api_keys": ["client-secret-1"]}, **on(database)))
    admin = Admin(gateway, "admin-secret-1")
    bad = admin.call("POST", "/admin/keys", json={"name": "x", "rpm": "lots"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rpm"
    bad = admin.call("POST", "/admin/keys", json={"name": "x", "budget": {"usd": -1}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "budget.usd"
    bad = admin.call("POST", "/admin/keys", json={"name": "x", "team": "nobody"})
    assert bad.status_code == 409 and bad.json()["error"]["param"] == "team"
    assert admin.call("GET", "/admin/spend?group_by=mood").json()["error"]["param"] == \
        "group_by"
    assert admin.call("GET", "/admin/spend?start=yesterday").json()["error"]["param"] == "start"
    assert Admin(gateway, "client-secret-1").call("GET", "/admin/keys").status_code == 403
    made = admin.key()
    assert Admin(gateway, made["key"]).call("GET", "/admin/keys").status_code == 403
    assert Admin(gateway).call("GET", "/admin/keys").status_code == 401
    # The static keys keep working beside the virtual ones.
    assert chat(gateway, "client-secret-1").status_code == 200
    assert chat(gateway, made["key"]).status_code == 200
    audit = admin.call("GET", "/admin/audit").json()["data"]
    assert audit[0]["action"] == "key_created" and audit[0]["actor"] != "local"


def test_a_database_from_a_newer_gateway_refuses_to_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    folder = state_dir({"XDG_STATE_HOME": str(state)}, tmp_path / "llms.json")
    folder.mkdir(parents=True)
    with sqlite3.connect(folder / "gateway.db") as db:
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        db.execute("INSERT INTO alembic_version VALUES ('9999_from_the_future')")
    (tmp_path / "llms.json").write_text('{"providers": {}}')
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(tmp_path / "llms.json"),
         "--port", "1"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "XDG_STATE_HOME": str(state), "HOME": str(tmp_path)})
    assert done.returncode == 2
    assert "9999_from_the_future" in done.stderr and "newer than this gateway" in done.stderr


def test_the_audit_log_names_who_disabled_a_provider_and_that_the_config_was_reloaded(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    doc = config({"main": provider(upstream.base_url, {"m": "m"})},
                 server={"admin_keys": [{"key": "admin-secret-2", "id": "ops-oncall"}]},
                 **on(database))
    gateway = start_gateway(doc)
    admin = Admin(gateway, "admin-secret-2")
    assert admin.call("POST", "/admin/providers/main/disable").status_code == 200
    doc["server"]["reload_interval"] = 0.3
    gateway.write_config(doc)

    def actions() -> list[tuple[str, str, str]]:
        return [(a["actor"], a["action"], a["target"])
                for a in admin.call("GET", "/admin/audit").json()["data"]]

    wait_until(lambda: any(a[1] == "config_reloaded" for a in actions()))
    assert ("ops-oncall", "provider_disabled", "main") in actions()
    assert "admin-secret-2" not in admin.call("GET", "/admin/audit").text


def test_a_limited_key_lists_only_its_aliases_and_cannot_probe_the_others(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream,
        database: str) -> None:
    gateway = start_gateway(priced(upstream, "m", "other", "third", **on(database)))
    secret = Admin(gateway).key(models=["m", "third"])["key"]
    client = openai.OpenAI(base_url=gateway.base_url, api_key=secret, max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["m", "third"]
    assert client.models.retrieve("m").id == "m"
    for name in ("other", "never-configured"):
        with pytest.raises(openai.PermissionDeniedError) as refused:
            client.models.retrieve(name)
        assert refused.value.code == "model_not_allowed"
    unlimited = Admin(gateway).key()["key"]
    everyone = openai.OpenAI(base_url=gateway.base_url, api_key=unlimited, max_retries=0)
    assert sorted(m.id for m in everyone.models.list()) == ["m", "other", "third"]


def test_the_head_a_worker_checks_for_is_the_newest_migration() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from gateway.accounts.database import HEAD, MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_current_head() == HEAD


def test_the_sdks_do_not_retry_an_answer_no_retry_can_change(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(priced(upstream, "m", "other"))
    admin = Admin(gateway)
    spent = admin.key(budget={"usd": 0.000001, "period": "month"})["key"]
    narrow = admin.key(models=["m"])["key"]

    def refusals() -> int:
        return sum(1 for line in gateway.log_events("request") if line.get("status") == 429)

    with pytest.raises(openai.RateLimitError) as refused:  # the SDK retries twice by default
        openai.OpenAI(base_url=gateway.base_url, api_key=spent).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=8)
    assert refused.value.code == "budget_exceeded"
    with pytest.raises(anthropic.RateLimitError):
        anthropic.Anthropic(base_url=gateway.url, api_key=spent).messages.create(
            model="m", messages=MESSAGES, max_tokens=8)
    not_allowed = chat(gateway, narrow, model="other")

    wait_until(lambda: refusals() >= 2, within=5)
    assert refusals() == 2, "one request each: neither SDK asked again"
    assert not_allowed.status_code == 403
    assert not_allowed.headers["x-should-retry"] == "false"
