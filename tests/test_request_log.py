"""Every request findable after the fact: the request log in the accounts database, read through
`/admin/logs` (issue 45, items 1 and 2).

An operator asks "why did this call cost that?" or "which provider answered at 14:02?": the
request, made with the OpenAI SDK, is found by its `x-request-id` with the tries it made, its
tokens and its cost as the answer and the spend table say. Bodies are kept only where asked,
never for a `private` key, redacted and bounded; the log is purged by age and by rows in small
batches, a million rows without the worker's memory moving.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.accounts.database import engine_url
from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.postgres_server import PostgresServer
from tests.test_cli import run
from tests.upstream import FakeUpstream, echo_prompt, ok, status

PRICE = {"input": 20.0, "output": 40.0}
KEY, PRIVATE_KEY = "gw-log-key-12345678", "gw-log-private-87654321"
SECRET = "sk-test-secret-123456"  # the fakes' upstream key (`tests.gateway_process.provider`)
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def first(upstream_factory: Callable[[str], FakeUpstream]) -> FakeUpstream:
    return upstream_factory("first")


@pytest.fixture
def second(upstream_factory: Callable[[str], FakeUpstream]) -> FakeUpstream:
    return upstream_factory("second")


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
    """A story on SQLite (a file of its own) and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{database_path(tmp_path)}"
    if postgres is None:
        pytest.skip("PostgreSQL's binaries are not installed")
    return postgres.database(f"logs_{os.urandom(6).hex()}")


def read(database: str, query: str, **params: Any) -> list[dict[str, Any]]:
    """What a table holds, read from the database itself (not through the gateway)."""
    async def rows() -> list[dict[str, Any]]:
        engine = create_async_engine(engine_url(database))
        try:
            async with engine.connect() as conn:
                found = await conn.execute(sa.text(query), params)
                return [dict(r) for r in found.mappings()]
        finally:
            await engine.dispose()
    return asyncio.run(rows())


def logged(first: FakeUpstream, second: FakeUpstream, tmp_path: Path,
           logs: dict[str, Any] | None = None, database: str | None = None,
           **extra: Any) -> dict[str, Any]:
    """Alias `m` served by `first` then `second`, `kept` (bodies captured) and `plain` by
    `second`; the accounts database `database`, else a SQLite file of the test's own; `logs`
    as given."""
    models = {"m": {"id": "m-upstream", "price": PRICE}}
    doc = config({
        "first": provider(first.base_url, models),
        "second": provider(second.base_url, {
            **models, "kept": {"id": "kept-upstream", "price": PRICE},
            "plain": {"id": "plain-upstream", "price": PRICE}}),
    }, defaults={"circuit": {"enabled": False}},
        database={"url": database or f"sqlite:///{database_path(tmp_path)}"}, **extra)
    doc["models"] = {"kept": {"logs": {"capture": "bodies"}}}
    if logs is not None:
        doc["logs"] = logs
    return doc


def database_path(tmp_path: Path) -> Path:
    return tmp_path / "accounts.db"


class Admin:
    """The admin API as an operator's script calls it (from this machine, no admin key)."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.url = gateway.url

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, timeout=10)

    def logs(self, **params: Any) -> dict[str, Any]:
        found = self.get("/admin/logs", **params)
        assert found.status_code == 200, found.text
        return dict(found.json())

    def log(self, request_id: str) -> dict[str, Any]:
        found = self.get(f"/admin/logs/{request_id}")
        assert found.status_code == 200, found.text
        return dict(found.json())

    def key(self, **body: Any) -> dict[str, Any]:
        made = httpx.post(f"{self.url}/admin/keys", json={"name": "k", **body}, timeout=10)
        assert made.status_code == 201, made.text
        return dict(made.json())


def test_a_request_made_with_the_openai_sdk_is_found_by_its_request_id_with_its_attempts(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path, database: str) -> None:
    gateway = start_gateway(logged(first, second, tmp_path, logs={}, database=database))
    admin = Admin(gateway)
    made = admin.key(name="alice")
    client = openai.OpenAI(base_url=gateway.base_url, api_key=made["key"], max_retries=0)
    first.set_mode(status(500, "first is down"))

    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]
    answer, request_id = raw.parse(), raw.headers["x-request-id"]

    found = admin.log(request_id)
    assert raw.headers["x-llms-attempts"] == "2"
    assert [(a["provider"], a["outcome"], a.get("status")) for a in found["attempts"]] == [
        ("first", "failed", 500), ("second", "answered", None)]
    assert found["provider"] == "second" and found["alias"] == "m"
    assert found["model"] == "m-upstream" and found["key"] == made["id"]
    assert found["status"] == 200 and found["error_code"] is None
    assert found["endpoint"] == "chat/completions" and found["payload"] == "disabled"
    assert answer.usage is not None
    assert (found["prompt_tokens"], found["completion_tokens"]) == (
        answer.usage.prompt_tokens, answer.usage.completion_tokens)
    assert found["cost"] == pytest.approx(float(raw.headers["x-llms-cost"]), abs=1e-6)
    assert found["overhead_ms"] == pytest.approx(float(raw.headers["x-llms-overhead-ms"]),
                                                 abs=0.01)
    assert found["duration_ms"] > 0 and found["ttft_ms"] is None  # a whole answer: no first token
    assert found["hedge"] is None
    assert not found["cache_hit"] and not found["replayed"] and found["guardrails"] == []
    assert admin.get("/admin/spend").status_code == 200  # it writes the spend rows it holds
    spent = read(database, "SELECT * FROM spend WHERE request_id = :id", id=request_id)
    assert len(spent) == 1 and spent[0]["cost"] == pytest.approx(found["cost"], abs=1e-9)
    assert (spent[0]["prompt_tokens"], spent[0]["completion_tokens"]) == (
        found["prompt_tokens"], found["completion_tokens"])
    listed = admin.logs(key=made["id"], provider="second")["data"]
    assert [row["request_id"] for row in listed] == [request_id]
    assert "request_body" not in listed[0] and listed[0]["attempts"] == found["attempts"]


def test_without_a_logs_section_no_request_is_logged(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path) -> None:
    gateway = start_gateway(logged(first, second, tmp_path))
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10,
                        json={"model": "m", "messages": MESSAGES})
    assert answer.status_code == 200
    gateway.request_line(answer.headers["x-request-id"])  # it ended: a row would be buffered

    missing = Admin(gateway).get(f"/admin/logs/{answer.headers['x-request-id']}")
    assert missing.status_code == 404 and "logs" in missing.json()["error"]["message"]
    assert Admin(gateway).logs() == {"data": [], "next_cursor": None}


def _chat(gateway: GatewayProcess, key: str, model: str, content: str = "hello",
          **extra: Any) -> httpx.Response:
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10,
                        headers={"Authorization": f"Bearer {key}"},
                        json={"model": model, "max_tokens": 8, **extra,
                              "messages": [{"role": "user", "content": content}]})
    assert answer.status_code == 200, answer.text
    return answer


def test_bodies_are_disabled_not_captured_or_stored_and_never_kept_for_a_private_key(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path) -> None:
    gateway = start_gateway(logged(
        first, second, tmp_path, logs={"capture": "metadata", "max_body_bytes": 512},
        server={"api_keys": [{"key": KEY, "id": "team-key"},
                             {"key": PRIVATE_KEY, "id": "private-key", "private": True}]}))
    admin = Admin(gateway)
    second.set_mode(ok("The answer is forty-two."))

    plain = _chat(gateway, KEY, "plain")
    kept = _chat(gateway, KEY, "kept", f"my upstream key is {SECRET}, keep it")
    private = _chat(gateway, PRIVATE_KEY, "kept", "private words")
    long = _chat(gateway, KEY, "kept", "x" * 4000)
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=10,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "kept", "messages": MESSAGES, "stream": True}) as streamed:
        assert b"[DONE]" in b"".join(streamed.iter_bytes())

    assert admin.log(plain.headers["x-request-id"])["payload"] == "disabled"
    assert admin.log(plain.headers["x-request-id"])["request_body"] is None
    stored = admin.log(kept.headers["x-request-id"])
    assert stored["payload"] == "stored"
    assert "keep it" in stored["request_body"] and SECRET not in stored["request_body"]
    assert "***" in stored["request_body"]
    assert json.loads(stored["response_body"])["choices"][0]["message"]["content"] == \
        "The answer is forty-two."
    hidden = admin.log(private.headers["x-request-id"])
    assert hidden["payload"] == "not_captured" and hidden["request_body"] is None
    assert hidden["response_body"] is None and hidden["key"] == "private-key"
    assert len(admin.log(long.headers["x-request-id"])["request_body"].encode()) == 512
    text = admin.log(streamed.headers["x-request-id"])
    assert text["stream"] and text["response_body"] == "The answer is forty-two."
    assert text["duration_ms"] >= text["ttft_ms"] > 0
    # Nothing of the private key's request is in the database, read from the file itself.
    assert read(f"sqlite:///{database_path(tmp_path)}", "SELECT request_body, response_body "
                "FROM request_log WHERE key_id = 'private-key'") == [
        {"request_body": None, "response_body": None}]


def test_a_key_s_own_capture_keeps_its_bodies_on_any_alias(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path) -> None:
    gateway = start_gateway(logged(first, second, tmp_path, logs={}))
    admin = Admin(gateway)
    made = admin.key(name="debugged", logs={"capture": "bodies"})
    other = admin.key(name="quiet")
    assert made["logs"] == {"capture": "bodies"} and other["logs"] is None

    debugged = _chat(gateway, made["key"], "plain", "trace me")
    quiet = _chat(gateway, other["key"], "plain", "not me")

    assert admin.log(debugged.headers["x-request-id"])["request_body"].count("trace me") == 1
    assert admin.log(quiet.headers["x-request-id"])["payload"] == "disabled"
    turned = httpx.patch(f"{gateway.url}/admin/keys/{made['id']}", timeout=10,
                         json={"logs": {"capture": "metadata"}})
    assert turned.status_code == 200 and turned.json()["logs"] == {"capture": "metadata"}
    assert admin.log(_chat(gateway, made["key"], "plain").headers["x-request-id"])[
        "payload"] == "disabled"
    wrong = httpx.patch(f"{gateway.url}/admin/keys/{made['id']}", timeout=10,
                        json={"logs": {"capture": "everything"}})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "logs.capture"

    # The same from a shell.
    typed = run("keys", "create", "--name", "shell", "--log-capture", "bodies",
                "--url", gateway.url)
    assert typed.returncode == 0, typed.stderr
    shell = next(key for key in httpx.get(f"{gateway.url}/admin/keys", timeout=10).json()[
        "data"] if key["name"] == "shell")
    assert shell["logs"] == {"capture": "bodies"}
    cleared = run("keys", "update", shell["id"], "--log-capture", "none",
                  "--url", gateway.url)
    assert cleared.returncode == 0 and "key_" in cleared.stdout
    assert httpx.get(f"{gateway.url}/admin/keys/{shell['id']}", timeout=10).json()[
        "logs"] is None
    refused = run("keys", "create", "--name", "x", "--log-capture", "all",
                  "--url", gateway.url)
    assert refused.returncode == 2 and "--log-capture" in refused.stderr


def test_filters_and_cursor_pages_walk_the_log_newest_first(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path, database: str) -> None:
    gateway = start_gateway(logged(first, second, tmp_path, logs={"capture": "bodies"},
                                   database=database))
    admin = Admin(gateway)
    alice, bob = admin.key(name="alice"), admin.key(name="bob")
    sent = [_chat(gateway, (alice if i % 2 else bob)["key"], "plain" if i < 5 else "m",
                  f"question {i}").headers["x-request-id"] for i in range(7)]
    missing = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10,
                         headers={"Authorization": f"Bearer {alice['key']}"},
                         json={"model": "nothing", "messages": MESSAGES})
    assert missing.status_code == 404
    newest_first = [missing.headers["x-request-id"], *reversed(sent)]

    pages, cursor = [], None
    while True:
        page = admin.logs(limit=3, **({"cursor": cursor} if cursor else {}))
        pages.append([row["request_id"] for row in page["data"]])
        if (cursor := page["next_cursor"]) is None:
            break
    assert pages == [newest_first[:3], newest_first[3:6], newest_first[6:]]

    def ids(**filters: Any) -> list[str]:
        return [row["request_id"] for row in admin.logs(**filters)["data"]]

    assert ids(key=alice["id"]) == [r for r in newest_first if r in sent[1::2]
                                    or r == newest_first[0]]
    assert ids(alias="m") == list(reversed(sent[5:]))
    assert ids(model="plain-upstream") == list(reversed(sent[:5]))
    assert ids(status=404) == [newest_first[0]]
    assert ids(q="QUESTION 3") == [sent[3]]
    assert ids(q="%") == []  # a wildcard is a character like any other
    now = time.time()
    assert ids(since=_iso(now + 60)) == [] and len(ids(until=_iso(now + 60))) == 8
    assert ids(provider="first") == [sent[6], sent[5]]  # `m` is first's while it answers
    assert ids(provider="second", limit=2) == [sent[4], sent[3]]
    for params, param in (({"status": "oops"}, "status"), ({"since": "yesterday"}, "since"),
                          ({"cursor": "not-a-cursor"}, "cursor"), ({"limit": "0"}, "limit"),
                          ({"format": "csv"}, "format"), ({"models": "m"}, "models"),
                          ({"q": ""}, "q")):
        refused = admin.get("/admin/logs", **params)
        assert refused.status_code == 400, params
        assert refused.json()["error"]["param"] == param


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def test_the_export_streams_every_matching_row_as_ndjson(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path) -> None:
    gateway = start_gateway(logged(first, second, tmp_path, logs={}))
    sent = [httpx.post(f"{gateway.base_url}/chat/completions", timeout=10,
                       json={"model": "plain", "messages": MESSAGES}).headers["x-request-id"]
            for _ in range(5)]

    with httpx.stream("GET", f"{gateway.url}/admin/logs",
                      params={"format": "ndjson", "alias": "plain"}, timeout=10) as export:
        assert export.status_code == 200
        assert export.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in export.iter_lines() if line]

    assert [line["request_id"] for line in lines] == list(reversed(sent))
    assert all(line["alias"] == "plain" and line["attempts"] for line in lines)


def test_the_admin_logs_need_an_admin_key(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path) -> None:
    gateway = start_gateway(logged(first, second, tmp_path, logs={}, server={
        "api_keys": [KEY], "admin_keys": ["gw-admin-key-000000"]}))
    _chat(gateway, KEY, "plain")

    for path in ("/admin/logs", "/admin/logs/anything"):
        assert httpx.get(f"{gateway.url}{path}", timeout=10).status_code == 401
        assert httpx.get(f"{gateway.url}{path}", timeout=10,
                         headers={"Authorization": f"Bearer {KEY}"}).status_code == 403
    seen = httpx.get(f"{gateway.url}/admin/logs", timeout=10,
                     headers={"Authorization": "Bearer gw-admin-key-000000"})
    assert seen.status_code == 200 and len(seen.json()["data"]) == 1



EMAIL, PHONE = "alice@example.com", "+1 415 555 2671"
API_SECRET = "sk-proj-Zq8d7Xc2Vb9Nm4Lk1Jh6Gf3Ds5Aa0Pp"


def test_a_guarded_request_s_row_lists_the_guardrails_actions_and_keeps_only_placeholders(
        start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
        second: FakeUpstream, tmp_path: Path) -> None:
    """Issue 44 items 6 and 7: the request log records what guardrails did, and what it keeps
    of bodies is what providers saw (placeholders), never the values they replaced."""
    doc = logged(first, second, tmp_path, logs={"capture": "bodies"})
    doc["guardrails"] = {"pii": {"detect": ["email", "phone"], "action": "pseudonymize"},
                         "no-secrets": {"detect": ["secrets"], "action": "block"}}
    doc["models"] = {"plain": {"guardrails": ["pii", "no-secrets"]}}
    gateway = start_gateway(doc)
    admin = Admin(gateway)
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    second.set_mode(echo_prompt())
    prompt = f"Mail {EMAIL} or call {PHONE}"

    whole = client.chat.completions.with_raw_response.create(
        model="plain", messages=[{"role": "user", "content": prompt}])
    streamed = client.chat.completions.with_raw_response.create(
        model="plain", messages=[{"role": "user", "content": prompt}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="plain", messages=[
            {"role": "user", "content": f"deploy with {API_SECRET}"}])

    assert whole.parse().choices[0].message.content == text == prompt  # the client's own
    assert whole.headers["x-llms-guardrails"] == "pseudonymize:pii=2"
    for answer in (whole, streamed):
        row = admin.log(answer.headers["x-request-id"])
        assert row["guardrails"] == ["pseudonymize:pii=2"]
        assert row["payload"] == "stored"
        for body in (row["request_body"], row["response_body"]):
            assert "[EMAIL_1]" in body and "[PHONE_1]" in body, body
            assert EMAIL not in body and PHONE not in body, body
    blocked = admin.log(refused.value.response.headers["x-request-id"])
    assert (blocked["status"], blocked["error_code"]) == (400, "guardrail_violation")
    assert blocked["guardrails"] == ["block:no-secrets"] and blocked["attempts"] == []
    assert blocked["payload"] == "not_captured" and blocked["request_body"] is None
    listed = admin.logs(alias="plain")["data"]
    assert [row["guardrails"] for row in listed] == [
        ["block:no-secrets"], ["pseudonymize:pii=2"], ["pseudonymize:pii=2"]]
    # Nothing the guardrails took out is in the database file itself.
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("accounts.db*"))  # WAL too
    assert b"[EMAIL_1]" in stored
    for value in (EMAIL, PHONE, API_SECRET):
        assert value.encode() not in stored, value


# --- retention: a million rows -----------------------------------------------------------------

MILLION = 1_000_000
# Synthetic rows as fast as SQLite makes them: one statement, generated inside the database.
SYNTHETIC = """
INSERT INTO request_log (time, request_id, key_id, endpoint, alias, stream, attempts, hedged,
  hedge_won, cache_hit, replayed, resumed, guardrails, duration_ms, status, outcome, payload,
  request_body)
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
SELECT ? + i * 0.001, 'synthetic-' || i, 'key_synthetic', 'chat/completions', 'm', 0,
  '[{"provider":"first","outcome":"answered"}]', 0, 0, 0, 0, 0, '[]', 12.5, 200, 'completed',
  'stored', 'a prompt of a few dozen bytes, as a small request has' FROM n
"""
MARGIN = 24 * 1024 * 1024  # bytes the worker may grow by while it purges (SQLite's caches)


def memory(pid: int) -> dict[str, int]:
    """The process's resident set now and at its peak (VmRSS, VmHWM), in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as status_file:
        for line in status_file:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
    return found


@pytest.fixture
def quiet_gateway(start_gateway: Callable[..., GatewayProcess], first: FakeUpstream,
                  second: FakeUpstream, tmp_path: Path) -> Iterator[GatewayProcess]:
    yield start_gateway(logged(first, second, tmp_path, logs={
        "retention_days": 30, "max_rows": 1000, "purge_interval": 1}))


def test_retention_purges_a_million_rows_in_small_batches_with_the_worker_s_rss_flat(
        quiet_gateway: GatewayProcess, tmp_path: Path) -> None:
    """The slow one (a few seconds): a million synthetic rows, half past the retention's age
    and the rest past its row bound, purged by the running worker while its memory is
    sampled."""
    gateway = quiet_gateway
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=10,
                        json={"model": "m", "messages": MESSAGES})
    worker = gateway.request_line(answer.headers["x-request-id"])["pid"]
    Admin(gateway).log(answer.headers["x-request-id"])  # written, and the worker warmed up
    before = memory(worker)

    now = time.time()
    with sqlite3.connect(database_path(tmp_path), timeout=30) as conn:
        conn.execute(SYNTHETIC, (MILLION // 2, now - 90 * 86400))  # older than 30 days
        conn.execute(SYNTHETIC.replace("'synthetic-'", "'recent-'"),
                     (MILLION // 2, now - 86400))  # recent, but past the newest 1000 rows
    peak = before["VmRSS"]

    def purged() -> bool:
        nonlocal peak
        peak = max(peak, memory(worker)["VmRSS"])
        with sqlite3.connect(database_path(tmp_path), timeout=30) as conn:
            return int(conn.execute("SELECT count(*) FROM request_log").fetchone()[0]) <= 1000
    wait_until(purged, within=120, what="the purge down to 1000 rows")

    after = memory(worker)
    print(f"worker RSS {before['VmRSS'] >> 20} MiB before, peak {peak >> 20} MiB while "
          f"purging, {after['VmRSS'] >> 20} MiB after (high-water {before['VmHWM'] >> 20} -> "
          f"{after['VmHWM'] >> 20} MiB)")
    assert peak - before["VmRSS"] < MARGIN
    assert after["VmHWM"] < max(before["VmHWM"], before["VmRSS"] + MARGIN)
    kept = read(f"sqlite:///{database_path(tmp_path)}", "SELECT count(*) AS n FROM request_log "
                "WHERE request_id LIKE 'recent-%' AND time > :since", since=now - 2 * 86400)
    assert kept == [{"n": 1000}]  # the newest thousand, all of them


# --- the pure parts ----------------------------------------------------------------------------

def test_a_hedged_resumed_request_lists_every_try_in_order_and_its_row_fills_every_column(
) -> None:
    from gateway.core.errors import Attempt
    from gateway.core.record import Outcome, Record
    from gateway.requestlog.journal import attempts, row
    from gateway.requestlog.store import COLUMNS
    from providers.contract.provider import Resumes

    record = Record("r-1", "chat/completions", ())
    record.failed = (Attempt("first", 503, "unavailable", "down"),)
    record.provider, record.lost, record.hedged, record.hedge_won = "third", ("second",), \
        True, True
    record.resumes = Resumes(ok=1, by="fourth")
    record.end(Outcome.COMPLETED)

    assert attempts(record) == [
        {"provider": "first", "outcome": "failed", "status": 503, "reason": "unavailable"},
        {"provider": "second", "outcome": "lost", "hedge": False},
        {"provider": "third", "outcome": "answered", "hedge": True},
        {"provider": "fourth", "outcome": "resumed"}]
    made = row(time.time(), record, 0.5, "m-upstream", ("disabled", None, None))
    assert len(made) == len(COLUMNS) and made[COLUMNS.index("cost")] == 0.5
    assert made[COLUMNS.index("payload")] == "disabled" and made[COLUMNS.index("resumed")] == 1


def test_a_stream_s_text_is_read_from_each_dialect_s_events() -> None:
    from gateway.requestlog.capture import event_text

    assert event_text(b'{"choices":[{"delta":{"content":"Hi"}}]}') == "Hi"
    assert event_text(b'{"choices":[{"text":"Hi"}]}') == "Hi"
    assert event_text(b'{"type":"content_block_delta","delta":{"type":"text_delta",'
                      b'"text":"Hi"}}') == "Hi"
    assert event_text(b'{"type":"response.output_text.delta","delta":"Hi"}') == "Hi"
    assert event_text(b'{"type":"response.function_call_arguments.delta","delta":"{"}') == ""
    assert event_text(b"[DONE]") == "" and event_text(b'{"choices":[{"delta":{}}]}') == ""
