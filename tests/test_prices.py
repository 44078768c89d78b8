"""Money counted where it is held, at the price of the model that serves: an operator's stories
with virtual keys and budgets, through a real gateway and fake upstreams that bill real usage.

Each hold is seen from outside the way a client sees it: a request whose worst case does not fit
what is left of its budget is refused (429 `budget_exceeded`) before any upstream is called, and
one that fits is answered and charged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config, provider
from tests.test_cli import run
from tests.test_teams import MESSAGES, PRICE, Admin, chat
from tests.upstream import FakeUpstream, status

DEAR = {"input": 1000.0, "output": 1000.0}  # the issue's: $0.008 a request of a few tokens
ADMIN = "admin-key-for-prices-01"


def post(gateway: GatewayProcess, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/{path}", timeout=20, json=body,
                      headers={"Authorization": f"Bearer {key}"})


def refused_for_budget(answer: httpx.Response) -> bool:
    return answer.status_code == 429 and answer.json()["error"]["code"] == "budget_exceeded"


def test_a_short_name_for_a_priced_model_is_priced_as_that_model(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("billing")
    gateway = start_gateway(config(
        {"main": provider(upstream.base_url, {"priced": {"id": "m", "price": DEAR},
                                              "plain": "m"})},
        models={"short-*": {"alias_of": "plain"}}))
    admin = Admin(gateway)
    tight = admin.key(budget={"usd": 0.001, "period": "total"})["key"]

    assert refused_for_budget(chat(gateway, tight, "priced"))
    for name in ("plain", "short-name"):  # the alias, and a pattern that reaches it
        assert refused_for_budget(chat(gateway, tight, name)), name
    assert upstream.requests == []

    roomy = admin.key(budget={"usd": 5.0, "period": "total"})["key"]
    answer = chat(gateway, roomy, "plain")
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    charged = (usage["prompt_tokens"] + usage["completion_tokens"]) * 1000 / 1e6
    assert float(answer.headers["x-llms-cost"]) == charged > 0
    assert float(answer.headers["x-llms-budget-remaining"]) < 5.0


def test_a_budgeted_key_is_refused_a_model_no_price_is_known_for(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("local")  # on this machine: genai-prices prices nothing here
    gateway = start_gateway(config({"local": provider(upstream.base_url, {"free": "my-model"})}))
    admin = Admin(gateway)
    budgeted = admin.key(budget={"usd": 100.0, "period": "month"})["key"]

    answer = chat(gateway, budgeted, "free")
    error = answer.json()["error"]
    assert answer.status_code == 403 and error["code"] == "model_unpriced", answer.text
    assert error["param"] == "model" and "no known price" in error["message"]
    assert "my-model on local" in error["message"] and "defaults.unpriced" in error["message"]
    assert upstream.requests == []

    unbudgeted = admin.key()["key"]  # no budget: nothing to charge, nothing refused
    assert chat(gateway, unbudgeted, "free").status_code == 200


def test_a_stated_price_for_unpriced_models_is_held_and_charged(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("local")
    gateway = start_gateway(config({"local": provider(upstream.base_url, {"free": "my-model"})},
                                   defaults={"unpriced": DEAR}))
    admin = Admin(gateway)
    tight = admin.key(budget={"usd": 0.001, "period": "total"})["key"]
    assert refused_for_budget(chat(gateway, tight, "free"))
    assert upstream.requests == []

    roomy = admin.key(budget={"usd": 5.0, "period": "total"})["key"]
    answer = chat(gateway, roomy, "free")
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert float(answer.headers["x-llms-cost"]) \
        == (usage["prompt_tokens"] + usage["completion_tokens"]) * 1000 / 1e6 > 0


def test_a_continued_conversation_is_held_at_its_whole_length(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("billing")
    gateway = start_gateway(config({"main": provider(
        upstream.base_url, {"m": {"id": "m-upstream", "price": PRICE}})}))
    secret = Admin(gateway).key(budget={"usd": 0.3, "period": "total"})["key"]
    long_turn = "word " * 8000  # 40 KB: about $0.16 of prompt at $20 per million tokens

    first = post(gateway, secret, "responses", {"model": "m", "input": long_turn,
                                                 "max_output_tokens": 8})
    assert first.status_code == 200, first.text
    left = float(first.headers["x-llms-budget-remaining"])
    assert 0 < left < 0.3

    # Sixty bytes that send the whole 40 KB conversation upstream again: more than is left.
    again = post(gateway, secret, "responses", {
        "model": "m", "input": "and?", "max_output_tokens": 8,
        "previous_response_id": first.json()["id"]})
    assert refused_for_budget(again), again.text
    assert len(upstream.requests) == 1


def test_n_answers_and_token_ids_are_held_in_full(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("billing")
    gateway = start_gateway(config({"main": provider(upstream.base_url, {
        "m": {"id": "m-upstream", "price": PRICE},
        "draw": {"id": "gpt-image-1", "price": PRICE},
        "embed": {"id": "e-upstream", "price": PRICE}})}))
    admin = Admin(gateway)

    # 100 tokens at $40 per million: $0.004 an answer; 128 of them are $0.51.
    chats = admin.key(budget={"usd": 0.05, "period": "total"})["key"]
    assert chat(gateway, chats, max_tokens=100).status_code == 200
    assert refused_for_budget(chat(gateway, chats, max_tokens=100, n=128))

    # An image's longest answer (4,096 tokens, $0.16): one fits $1, ten do not.
    images = admin.key(budget={"usd": 1.0, "period": "total"})["key"]
    assert post(gateway, images, "images/generations",
                {"model": "draw", "prompt": "a cat"}).status_code == 200
    assert refused_for_budget(post(gateway, images, "images/generations",
                                   {"model": "draw", "prompt": "a cat", "n": 10}))

    # 4,000 token ids written in 8,000 bytes: 4,000 tokens ($0.08), not 2,000 ($0.04).
    ids = admin.key(budget={"usd": 0.06, "period": "total"})["key"]
    for given in ([1] * 4000, [[1] * 2000, [1] * 2000]):
        assert refused_for_budget(post(gateway, ids, "embeddings",
                                       {"model": "embed", "input": given}))
    assert not [r for r in upstream.requests if r.path.endswith("/embeddings")]


def test_the_hold_takes_the_largest_output_asked_and_that_is_what_is_sent(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("billing")
    gateway = start_gateway(config({"main": provider(
        upstream.base_url, {"m": {"id": "m-upstream", "price": PRICE}},
        max_tokens_field="max_completion_tokens")}))
    admin = Admin(gateway)

    # 100,000 tokens at $40 per million are $4, whichever spelling says it.
    tight = admin.key(budget={"usd": 1.0, "period": "total"})["key"]
    for small, large in (("max_completion_tokens", "max_tokens"),
                         ("max_tokens", "max_completion_tokens")):
        answer = post(gateway, tight, "chat/completions", {
            "model": "m", "messages": MESSAGES, small: 1, large: 100_000})
        assert refused_for_budget(answer), (small, answer.text)
    assert upstream.requests == []

    # The one field this provider takes carries the largest asked: what the hold assumed.
    roomy = admin.key(budget={"usd": 50.0, "period": "total"})["key"]
    for sent in ({"max_completion_tokens": 5, "max_tokens": 50},
                 {"max_tokens": 50, "max_completion_tokens": 5}):
        answer = post(gateway, roomy, "chat/completions",
                      {"model": "m", "messages": MESSAGES, **sent})
        assert answer.status_code == 200, answer.text
        got = upstream.last_json
        assert got["max_completion_tokens"] == 50 and "max_tokens" not in got
    # The Responses bridge sends chat's `max_tokens`: the largest its body asked too.
    answer = post(gateway, roomy, "responses", {"model": "m", "input": "hi",
                                                "max_output_tokens": 50, "max_tokens": 5})
    assert answer.status_code == 200, answer.text
    assert upstream.last_json["max_completion_tokens"] == 50


def test_the_anthropic_kind_is_held_on_the_max_tokens_it_sends(
        start_gateway: Callable[..., GatewayProcess]) -> None:
    with FakeAnthropic(name="claude") as claude:
        gateway = start_gateway(config({"anthropic": {
            "type": "anthropic", "base_url": claude.base_url,
            "api_key": "sk-ant-test-key-0123456789",
            "models": {"claude": {"id": "claude-sonnet-4-5", "price": PRICE}}}}))
        admin = Admin(gateway)
        # `reasoning_effort: high` is sent as 16,384 tokens of thinking and `max_tokens`
        # 17,408: $0.70 at $40 per million, whatever small `max_tokens` the body said.
        tight = admin.key(budget={"usd": 0.5, "period": "total"})["key"]
        thinking = {"model": "claude", "messages": MESSAGES, "max_tokens": 1,
                    "reasoning_effort": "high"}
        assert refused_for_budget(post(gateway, tight, "chat/completions", thinking))
        assert refused_for_budget(post(gateway, tight, "chat/completions", {
            "model": "claude", "messages": MESSAGES, "max_completion_tokens": 1,
            "max_tokens": 20_000}))
        assert claude.requests == []

        roomy = admin.key(budget={"usd": 5.0, "period": "total"})["key"]
        answer = post(gateway, roomy, "chat/completions", {
            "model": "claude", "messages": MESSAGES, "max_tokens": 5,
            "max_completion_tokens": 50})
        assert answer.status_code == 200, answer.text
        assert claude.last_json["max_tokens"] == 50


def test_a_fallback_is_held_at_its_price_and_only_for_keys_that_may_use_it(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    cheap, dear, mid = (upstream_factory(name) for name in ("cheap", "dear", "mid"))
    gateway = start_gateway(config({
        "cheap": provider(cheap.base_url, {"cheap": {"id": "c", "price": {"input": 0.1,
                                                                          "output": 0.1}}}),
        "dear": provider(dear.base_url, {"dear": {"id": "d", "price": DEAR}}),
        "mid": provider(mid.base_url, {"mid": {"id": "m", "price": PRICE}}),
    }, models={"cheap": {"fallbacks": ["dear", "mid"]}}))
    admin = Admin(gateway)

    # 4,000 tokens cost cheap a twentieth of a cent, its fallback `dear` $4.
    tight = admin.key(budget={"usd": 1.0, "period": "total"})["key"]
    assert refused_for_budget(chat(gateway, tight, "cheap", max_tokens=4000))
    assert cheap.requests == [] and dear.requests == []

    # A key that may not use `dear` is never served by it: `mid`, which it may use, answers.
    cheap.set_mode(status(500))
    limited = admin.key(models=["cheap", "mid"], budget={"usd": 1.0, "period": "total"})["key"]
    assert chat(gateway, limited, "dear").status_code == 403
    answer = chat(gateway, limited, "cheap")
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-model"] == "mid" and dear.requests == []

    only = admin.key(models=["cheap"])["key"]  # no fallback it may use: cheap's own failure
    answer = chat(gateway, only, "cheap")
    assert answer.status_code == 502 and dear.requests == [] and len(mid.requests) == 1


def test_status_and_ls_flag_the_unpriced_models_a_budgeted_key_can_reach(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("local")
    doc = config({"main": provider(upstream.base_url, {
        "m": {"id": "m-upstream", "price": PRICE}, "free": "my-model", "other": "o"})},
        server={"admin_keys": ["$PRICES_ADMIN_KEY"]})
    gateway = GatewayProcess(tmp_path, doc, env={"PRICES_ADMIN_KEY": ADMIN})
    doc["server"]["port"] = gateway.port  # `ls` finds the gateway where the config says
    gateway.write_config(doc)
    gateway.start()
    try:
        admin = Admin(gateway, ADMIN)

        def status_of() -> dict[str, Any]:
            return dict(httpx.get(f"{gateway.url}/status.json", timeout=5,
                                  headers={"Authorization": f"Bearer {ADMIN}"}).json())

        assert status_of()["unpriced"] == []  # no budgeted key yet: nothing to refuse
        admin.key(models=["m", "free"], budget={"usd": 1.0, "period": "day"})

        flagged = status_of()["unpriced"]
        assert flagged == [{"alias": "free", "provider": "main", "model": "my-model",
                            "budgeted": "refused"}]  # `other` is no budgeted key's
        listed = run("ls", "--config", str(gateway.config_path),
                     env={"PRICES_ADMIN_KEY": ADMIN})
    finally:
        gateway.stop()
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout
    assert "UNPRICED models a budgeted key can reach (defaults.unpriced: refused to " \
           "budgeted keys):" in text
    assert "  - free on main -> my-model" in text and "other on main" not in text

