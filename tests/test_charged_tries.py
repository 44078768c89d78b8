"""Every try a provider bills is charged (issue 42, finding 8), and a quiet alias hedges
(finding 2).

The stories run through real sockets: the admin API makes a virtual key with a budget, a
client spends it against fake upstreams that bill real usage, and the spend table (read
through the admin API) says what the key was charged. What each story expects is read from
what the gateway and the upstreams answered, never written down.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.test_teams import Admin
from tests.upstream import (
    FakeUpstream,
    _prompt_tokens,
    ok,
    slow_first_token,
    stream_cut,
)

PRICE = {"input": 20.0, "output": 40.0}  # dollars per million tokens
DEAR = {"input": 200.0, "output": 400.0}
MESSAGES = [{"role": "user", "content": "hello"}]


def dollars(tokens: int, per_million: float) -> float:
    return tokens * per_million / 1_000_000


def on_sqlite(tmp_path: Path) -> dict[str, Any]:
    return {"database": {"url": f"sqlite:///{tmp_path / 'spend.db'}"}}


def body(**extra: Any) -> bytes:
    """The request as the client writes it: its bytes are what the hold estimates from."""
    return json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 8, **extra}).encode()


def post(gateway: GatewayProcess, key: str, raw: bytes, timeout: float = 20) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", content=raw, timeout=timeout,
                      headers={"Authorization": f"Bearer {key}",
                               "Content-Type": "application/json"})


def leave_early(gateway: GatewayProcess, key: str, raw: bytes) -> None:
    """A client that gives up before the answer comes, and closes its connection."""
    with pytest.raises(httpx.ReadTimeout):
        answered = post(gateway, key, raw, timeout=0.5)
        pytest.fail(f"answered before the client left: {answered.text}")


def charged(admin: Admin, key_id: str, requests: int) -> float:
    """What the key was charged, once its `requests` requests have all ended."""
    wait_until(lambda: admin.spend().get(key_id, {}).get("requests") == requests, within=15)
    return float(admin.spend()[key_id]["cost"])


def usage_cost(answer: dict[str, Any], price: dict[str, float]) -> float:
    usage = answer["usage"]
    return dollars(usage["prompt_tokens"], price["input"]) \
        + dollars(usage["completion_tokens"], price["output"])


# -- a whole request whose client left -------------------------------------------------------


def test_a_whole_request_whose_client_left_is_charged_what_the_upstream_generated(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    upstream = upstream_factory("billing")
    gateway = start_gateway(config({"main": provider(upstream.base_url, {
        "m": {"id": "m-upstream", "price": PRICE}})}, **on_sqlite(tmp_path)))
    admin = Admin(gateway)
    # What one answer costs when its client waits for it, and the worst case its budget holds
    # for it (a dollar less what is left with it held).
    waited = post(gateway, admin.key(name="patient", budget={"usd": 1.0, "period": "total"})[
        "key"], body())
    assert waited.status_code == 200
    each = float(waited.headers["x-llms-cost"])
    hold = 1.0 - float(waited.headers["x-llms-budget-remaining"])
    # A budget for three answers (the third's hold on top of two answers), never a fourth.
    made = admin.key(name="impatient", budget={"usd": round(hold + 2.5 * each, 6),
                                               "period": "total"})

    upstream.set_mode(slow_first_token(2.0))  # the answer comes after its client left
    for left in range(1, 4):
        leave_early(gateway, made["key"], body())
        charged(admin, made["id"], left)  # its hold given back, its charge counted

    # The upstream generated three answers: the key is charged three answers.
    assert charged(admin, made["id"], 3) == pytest.approx(3 * each, abs=1e-9)
    upstream.set_mode(ok())
    refused = post(gateway, made["key"], body())
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"


def test_a_whole_request_whose_client_left_and_whose_answer_never_came_is_charged_its_hold(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    upstream = upstream_factory("billing")
    gateway = start_gateway(config({"main": provider(upstream.base_url, {
        "m": {"id": "m-upstream", "price": PRICE}})}, **on_sqlite(tmp_path)))
    admin = Admin(gateway)
    made = admin.key(budget={"usd": 1.0, "period": "total"})
    answered = post(gateway, made["key"], body())
    first = float(answered.headers["x-llms-cost"])
    # The worst case the budget held for it: what was left, less what is left with it held.
    hold = 1.0 - first - float(post(gateway, made["key"], body()).headers[
        "x-llms-budget-remaining"])
    second = first  # the same request, the same answer

    # The upstream works on it after the client left, then its answer breaks off: what it
    # generated is unknown, and billed all the same.
    upstream.set_mode(slow_first_token(2.0, then=stream_cut()))
    leave_early(gateway, made["key"], body())

    assert charged(admin, made["id"], 3) == pytest.approx(first + second + hold, abs=1e-8)
    assert hold > first


# -- hedges that lost ------------------------------------------------------------------------


def test_a_hedge_that_lost_is_charged_its_prompt_at_its_provider_s_price(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    slow, quick = upstream_factory("slow"), upstream_factory("quick")
    slow.set_mode(slow_first_token(2.0))
    gateway = start_gateway(config({
        "slow": provider(slow.base_url, {"m": {"id": "m-slow", "price": DEAR}}),
        "quick": provider(quick.base_url, {"m": {"id": "m-quick", "price": PRICE}}),
    }, models={"m": {"routing": {"hedge_after": 0.3, "hedge_budget": 1}}},
        **on_sqlite(tmp_path)))
    admin = Admin(gateway)
    made = admin.key(budget={"usd": 1.0, "period": "total"})
    raw = body()

    answer = post(gateway, made["key"], raw)

    assert answer.status_code == 200 and answer.headers["x-llms-hedged"] == "1"
    assert answer.headers["x-llms-provider"] == "quick"
    assert slow.wait_for_cancel(), "the slow try was cancelled once the hedge answered"
    # The provider that lost bills the prompt it was sent: estimated as the hold does, a
    # token per four bytes of the request, at that provider's own price.
    lost = dollars((len(raw) + 3) // 4, DEAR["input"])
    expected = usage_cost(answer.json(), PRICE) + lost
    assert float(answer.headers["x-llms-cost"]) == pytest.approx(expected, abs=1e-9)
    assert charged(admin, made["id"], 1) == pytest.approx(expected, abs=1e-9)


# -- resumed streams -------------------------------------------------------------------------


def test_a_resumed_stream_is_charged_its_continuation_in_full(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    first, vllm = upstream_factory("first"), upstream_factory("vllm")
    words = " ".join(f"w{i}" for i in range(40))
    first.set_mode(replace(stream_cut(after_chunks=20), content=words))  # cut half way
    vllm.set_mode(ok(words))  # a model that goes on from the partial answer it is given
    gateway = start_gateway(config({
        "first": provider(first.base_url, {"m": {"id": "m", "price": PRICE}}),
        "vllm": provider(vllm.base_url, {"m": {"id": "m", "price": PRICE}},
                         continue_final_message=True),
    }, defaults={"circuit": {"enabled": False}}, models={"m": {"resume": True}},
        **on_sqlite(tmp_path)))
    admin = Admin(gateway)
    made = admin.key(budget={"usd": 1.0, "period": "total"})
    raw = body(stream=True, stream_options={"include_usage": True}, max_tokens=100)
    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", content=raw,
                      headers={"Authorization": f"Bearer {made['key']}",
                               "Content-Type": "application/json"}, timeout=20) as streamed:
        assert streamed.status_code == 200
        events = [json.loads(line[6:]) for line in streamed.iter_lines()
                  if line.startswith("data: {")]

    shown = next(e for e in events if e.get("usage"))  # one answer's usage, as it reads
    assert len(vllm.requests) == 1, "the stream was resumed by the second provider"
    # The continuation re-sent the prompt with the partial answer: billed for all of it, on
    # top of what the client is shown (the output of both tries, the prompt once).
    continuation_prompt = _prompt_tokens(vllm.requests[0].json)
    expected = usage_cost(shown, PRICE) + dollars(continuation_prompt, PRICE["input"])
    assert charged(admin, made["id"], 1) == pytest.approx(expected, abs=1e-9)
