"""One identity check on every route that acts for a key, and what a key reads by its role.

A careful operator runs a gateway with an admin key and virtual keys for tenants; an attacker
holds one tenant's key (or an expired one, or a revoked one, or none). Every route in the app's
route table refuses a key that is not valid now; a tenant reads its own conversations and no
other key's, sees no other key's spend on the status page nor its id in the metrics; the
passthrough matches its allow-list on the path as it is sent, and holds a tenant to its model
list and budget there as the relay does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway import config as gateway_config
from gateway.app import handlers
from gateway.edge.front import RELAY_PATHS
from gateway.edge.passthrough import PREFIX
from tests.fake_openai_batches import FakeOpenAIBatches
from tests.gateway_process import GatewayProcess, config, provider
from tests.test_batches import FAST, chat_line, finished, jsonl, sdk
from tests.test_teams import Admin, keyed_everywhere
from tests.upstream import FakeUpstream

ADMIN = "admin-key-identity-01"
PRICE = {"input": 20.0, "output": 40.0}
MESSAGES = [{"role": "user", "content": "hello"}]
PASSTHROUGH = ["/v1/models/*", "/v1/chat/completions", "/v1/vector_stores/*"]
# The routes that act for nobody: liveness, the status page's HTML, the OpenAPI document.
KEYLESS = {("GET", "/health"), ("GET", "/"), ("GET", "/openapi.json")}
# The console's page, files and sign-in routes act for a person's session (tests/test_console*),
# never for a key presented to them.
KEYLESS |= {("GET", "/ui"), ("GET", "/ui/static/x"), ("GET", "/ui/session"),
            ("POST", "/ui/login/key"), ("POST", "/ui/logout"), ("GET", "/ui/login"),
            ("GET", "/ui/callback")}


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture
def upstream(upstream_factory: Callable[[str], FakeUpstream]) -> FakeUpstream:
    return upstream_factory("main")


@pytest.fixture
def gateway(start_gateway: Callable[..., GatewayProcess],
            upstream: FakeUpstream) -> GatewayProcess:
    """Tenants on virtual keys alone; the operator's admin key."""
    models = {"cheap": {"id": "cheap-up", "price": PRICE},
              "dear": {"id": "dear-up", "price": PRICE}}
    return start_gateway(config({"main": provider(upstream.base_url, models,
                                                  passthrough=PASSTHROUGH)},
                                server={"admin_keys": [ADMIN]}))


def chat(gateway: GatewayProcess, key: str, model: str = "cheap") -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", headers=bearer(key), timeout=20,
                      json={"model": model, "messages": MESSAGES, "max_tokens": 8})


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, path parameters filled in."""
    snapshot = gateway_config.parse('{"providers": {}}', Path("llms.json"), {})
    found = {(method, re.sub(r"\{[^}]+\}", "x", path))
             for handler in handlers(snapshot) for path in handler.paths
             for method in handler.http_methods if method not in ("HEAD", "OPTIONS")}
    found |= {("POST", path) for path in RELAY_PATHS}
    found |= {(method, f"{PREFIX}main/v1/models/cheap-up") for method in ("GET", "POST")}
    return sorted(found)


# -- 7(d): an expired or revoked key, on every route ------------------------------------------


def test_every_route_that_acts_for_a_key_refuses_an_expired_or_revoked_one(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    admin = Admin(gateway, ADMIN)
    expired = admin.key(name="old", expires_at="2020-01-01T00:00:00Z")["key"]
    revoked = admin.key(name="gone")
    assert admin.call("DELETE", f"/admin/keys/{revoked['id']}").status_code == 200
    keyed_everywhere(gateway)
    routes = every_route()
    assert set(routes) >= KEYLESS, "the keyless list names routes that exist"

    for secret, says in ((expired, "expired"), (revoked["key"], "Invalid API key")):
        for method, path in routes:
            if (method, path) in KEYLESS:
                continue
            answer = httpx.request(method, f"{gateway.url}{path}", headers=bearer(secret),
                                   json={"model": "cheap"}, timeout=10)
            assert answer.status_code == 401, (method, path, answer.status_code, answer.text)
            assert says in answer.json()["error"]["message"], (method, path)
    assert not upstream.requests, "nothing went upstream for a key that is not valid"


# -- 7(c): stored responses under virtual keys ------------------------------------------------


def test_a_stored_response_is_read_and_deleted_by_its_virtual_key_alone(
        gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN)
    alice, bob = admin.key(name="alice")["key"], admin.key(name="bob")["key"]
    keyed_everywhere(gateway)
    made = httpx.post(f"{gateway.base_url}/responses", headers=bearer(alice), timeout=20,
                      json={"model": "cheap", "input": "alice's secret plans"})
    assert made.status_code == 200, made.text
    url = f"{gateway.base_url}/responses/{made.json()['id']}"

    for method, where in (("GET", url), ("GET", f"{url}/input_items"), ("DELETE", url)):
        assert httpx.request(method, where).status_code == 401, (method, where)
        assert httpx.request(method, where, headers=bearer("sk-llms-garbage-0000")
                             ).status_code == 401, (method, where)
        other = httpx.request(method, where, headers=bearer(bob))
        assert other.status_code == 404, (method, where, other.text)
        assert other.json()["error"]["code"] == "response_not_found"
    assert httpx.get(url, headers=bearer(alice)).json()["id"] == made.json()["id"]
    items = httpx.get(f"{url}/input_items", headers=bearer(alice)).json()
    assert "alice's secret plans" in str(items["data"])
    assert httpx.delete(url, headers=bearer(alice)).status_code == 200
    assert httpx.get(url, headers=bearer(alice)).status_code == 404, "deleted"


# -- findings 4 and 10: status by role --------------------------------------------------------


def test_a_tenant_reads_no_other_keys_spend_or_id_in_status_and_metrics(
        gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN)
    alice = admin.key(name="alice")
    bob = admin.key(name="bob-the-big-spender")
    keyed_everywhere(gateway)
    for key in (alice, bob, bob):
        assert chat(gateway, key["key"]).status_code == 200

    for path in ("/status.json", "/metrics"):
        tenant = httpx.get(f"{gateway.url}{path}", headers=bearer(alice["key"]), timeout=20)
        operator = httpx.get(f"{gateway.url}{path}", headers=bearer(ADMIN), timeout=20)
        assert tenant.status_code == operator.status_code == 200, path
        assert bob["id"] not in tenant.text and "bob-the-big-spender" not in tenant.text, path
        assert bob["id"] in operator.text, f"{path}: the admin sees every key"
    status: dict[str, Any] = httpx.get(f"{gateway.url}/status.json",
                                       headers=bearer(ADMIN)).json()
    assert {row["key"] for row in status["spend"]["top_keys"]} == {alice["id"], bob["id"]}
    assert "spend" not in httpx.get(f"{gateway.url}/status.json",
                                    headers=bearer(alice["key"])).json()


# -- 7(b): passthrough ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/vector_stores/%2e%2e/files",
                                  "/v1/vector_stores/%252e%252e/files",
                                  "/v1/vector_stores/%25252E%25252E/files",
                                  "/v1/vector_stores/vs%2F..%2Ffiles",
                                  "/v1/vector_stores/.%2E/files"])
def test_passthrough_refuses_an_encoded_dot_segment_before_any_upstream_call(
        gateway: GatewayProcess, upstream: FakeUpstream, path: str) -> None:
    key = Admin(gateway, ADMIN).key(name="tenant")["key"]
    keyed_everywhere(gateway)

    answer = httpx.get(f"{gateway.url}/passthrough/main{path}", headers=bearer(key))

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "path"
    assert not upstream.requests


def test_passthrough_matches_and_sends_the_same_path(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    key = Admin(gateway, ADMIN).key(name="tenant")["key"]
    keyed_everywhere(gateway)

    answer = httpx.get(f"{gateway.url}/passthrough/main/v1//vector_stores/vs%5F1",
                       headers=bearer(key))

    assert answer.status_code == 200, answer.text
    assert answer.json()["path"] == "/v1/vector_stores/vs_1"


def test_passthrough_holds_a_tenant_to_its_model_list_and_its_budget(
        gateway: GatewayProcess, upstream: FakeUpstream) -> None:
    admin = Admin(gateway, ADMIN)
    cheap_only = admin.key(name="cheap-only", models=["cheap"])["key"]
    budgeted = admin.key(name="budgeted", budget={"usd": 0.001, "period": "total"})
    keyed_everywhere(gateway)
    url = f"{gateway.url}/passthrough/main/v1"

    for asked in (httpx.get(f"{url}/models/dear-up", headers=bearer(cheap_only)),
                  httpx.post(f"{url}/chat/completions", headers=bearer(cheap_only),
                             json={"model": "dear-up", "messages": MESSAGES})):
        assert asked.status_code == 403, asked.text
        assert asked.json()["error"]["code"] == "model_not_allowed"
        assert asked.json()["error"]["param"] == "model"
    assert not upstream.requests, "the relay's 403 holds on the passthrough too"
    assert httpx.post(f"{url}/chat/completions", headers=bearer(cheap_only),
                      json={"model": "cheap-up", "messages": MESSAGES}).status_code == 200

    spent = 0
    for _ in range(10):  # each answer is charged its usage until the budget is gone
        answer = httpx.post(f"{url}/chat/completions", headers=bearer(budgeted["key"]),
                            json={"model": "cheap-up", "messages": MESSAGES, "max_tokens": 8})
        if answer.status_code != 200:
            break
        spent += 1
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "budget_exceeded"
    assert 0 < spent < 10
    charged = admin.spend()[budgeted["id"]]
    assert 0 < charged["cost"] <= 0.001 + 1e-9
    upstream.reset()
    refused = httpx.get(f"{url}/models/cheap-up", headers=bearer(budgeted["key"]))
    assert refused.status_code == 429 and not upstream.requests


# -- 7(a): native batches ---------------------------------------------------------------------


def test_a_batch_an_upstream_runs_is_held_to_the_keys_models_and_budget_and_charged(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    with FakeOpenAIBatches(name="openai") as native:
        models = {"cheap": {"id": "cheap-up", "price": PRICE},
                  "dear": {"id": "dear-up", "price": PRICE}}
        gateway = start_gateway(config(
            {"openai": provider(native.base_url, models, batches="native")},
            server={"admin_keys": [ADMIN]}, batches=FAST))
        admin = Admin(gateway, ADMIN)
        cheap_only = admin.key(name="cheap-only", models=["cheap"])["key"]
        budgeted = admin.key(name="budgeted", budget={"usd": 0.001, "period": "total"})
        keyed_everywhere(gateway)

        with pytest.raises(openai.PermissionDeniedError) as refused:
            sdk(gateway, cheap_only).files.create(file=("r.jsonl", jsonl(
                [chat_line("a", "cheap"), chat_line("b", "dear")])), purpose="batch")
        assert refused.value.code == "model_not_allowed"
        assert "Line 2" in refused.value.message and "dear" in refused.value.message
        assert refused.value.param == "model"  # type: ignore[attr-defined]
        assert not native.files, "nothing went upstream"

        client = sdk(gateway, budgeted["key"])

        def batch(count: int) -> Any:
            lines = [chat_line(f"r{n}", "cheap") for n in range(count)]
            uploaded = client.files.create(file=("r.jsonl", jsonl(lines)), purpose="batch")
            return client.batches.create(input_file_id=uploaded.id,
                                         endpoint="/v1/chat/completions",
                                         completion_window="24h")

        with pytest.raises(openai.RateLimitError) as over:
            batch(10)  # ten lines' worst case is past the budget
        assert over.value.code == "budget_exceeded"
        assert not native.batches, "a batch over the budget never reaches the upstream"
        running = batch(1)
        with pytest.raises(openai.RateLimitError):
            batch(1)  # the first one's hold stands while it runs
        done = finished(client, running.id)

        assert done.status == "completed"
        usage = {"prompt_tokens": 3, "completion_tokens": 3}  # what the fake's output says
        expected = (usage["prompt_tokens"] * PRICE["input"]
                    + usage["completion_tokens"] * PRICE["output"]) / 1e6
        assert admin.spend()[budgeted["id"]]["cost"] == pytest.approx(expected)
        client.batches.retrieve(running.id)  # looked at again: charged once
        assert admin.spend()[budgeted["id"]]["cost"] == pytest.approx(expected)
