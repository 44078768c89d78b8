"""Stored responses: what the SDK's `responses.retrieve`, `delete` and `input_items.list` get.

The gateway stores what its bridge answered (a chat-only provider made to serve /v1/responses);
these routes read that store, in memory or in Redis across gateways, and with keys each client
key sees only its own responses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream

ALICE, BOB, ADMIN = "alice-key-00001", "bob-key-000001", "admin-key-00001"


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="chat") as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            upstream: FakeUpstream) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path_factory.mktemp("stored"), config(
        {"chat": provider(upstream.base_url, {"kimi": "kimi-k2"})})).start()
    yield process
    process.stop()


def client(gateway: GatewayProcess, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)


def test_a_response_is_retrieved_as_it_was_answered_and_then_deleted(
        gateway: GatewayProcess) -> None:
    sdk = client(gateway)
    created = sdk.responses.create(model="kimi", input="Hello there")
    fetched = sdk.responses.retrieve(created.id)
    assert fetched.id == created.id and fetched.output_text == created.output_text
    assert fetched.model == "kimi" and fetched.status == "completed"
    validate(httpx.get(f"{gateway.base_url}/responses/{created.id}").json(), "Response")

    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.responses.retrieve(created.id)
    assert caught.value.body["param"] == "response_id"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="kimi", input="and then?", previous_response_id=created.id)


def test_input_items_page_as_openai_pages_them(gateway: GatewayProcess) -> None:
    sdk = client(gateway)
    turns = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    created = sdk.responses.create(model="kimi", input=turns)  # type: ignore[arg-type]
    newest_first = [item.content[0].text for item in  # type: ignore[union-attr]
                    sdk.responses.input_items.list(created.id, limit=2)]
    assert newest_first == [f"message {n}" for n in (4, 3, 2, 1, 0)], "auto-paged by `after`"
    first = sdk.responses.input_items.list(created.id, limit=2, order="asc")
    assert [i.content[0].text for i in first.data] == ["message 0", "message 1"]  # type: ignore[union-attr]
    assert first.has_more is True
    page = httpx.get(f"{gateway.base_url}/responses/{created.id}/input_items").json()
    validate(page, "ResponseItemList")
    bad = httpx.get(f"{gateway.base_url}/responses/{created.id}/input_items?limit=500")
    assert bad.status_code == 400


def test_a_plain_string_input_is_one_user_message(gateway: GatewayProcess) -> None:
    sdk = client(gateway)
    created = sdk.responses.create(model="kimi", input="just this")
    items = sdk.responses.input_items.list(created.id).data
    assert len(items) == 1
    assert items[0].type == "message" and items[0].role == "user"  # type: ignore[union-attr]
    assert items[0].content[0].type == "input_text"  # type: ignore[union-attr]


def test_unknown_and_unstored_ids_are_404s_in_the_envelope(gateway: GatewayProcess) -> None:
    unknown = httpx.get(f"{gateway.base_url}/responses/resp_nothing")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "response_not_found"
    unstored = client(gateway).responses.create(model="kimi", input="forget me", store=False)
    assert httpx.get(f"{gateway.base_url}/responses/{unstored.id}").status_code == 404
    assert httpx.delete(f"{gateway.base_url}/responses/resp_nothing").status_code == 404


def test_each_key_sees_only_its_own_responses(
        start_gateway: Callable[..., GatewayProcess], upstream: FakeUpstream) -> None:
    gateway = start_gateway(config({"chat": provider(upstream.base_url, {"kimi": "kimi-k2"})},
                                   server={"api_keys": [ALICE, BOB], "admin_keys": [ADMIN]}))
    alices = client(gateway, ALICE).responses.create(model="kimi", input="mine")
    with pytest.raises(openai.NotFoundError):
        client(gateway, BOB).responses.retrieve(alices.id)
    with pytest.raises(openai.NotFoundError):
        client(gateway, BOB).responses.delete(alices.id)
    with pytest.raises(openai.AuthenticationError):
        client(gateway, "wrong-key-0000").responses.retrieve(alices.id)
    assert client(gateway, ADMIN).responses.retrieve(alices.id).id == alices.id
    assert client(gateway, ALICE).responses.retrieve(alices.id).output_text


@pytest.mark.skipif(not RedisServer.available(), reason="redis-server is not installed")
def test_a_response_stored_by_one_gateway_is_retrieved_and_deleted_on_another(
        tmp_path: Path, upstream: FakeUpstream) -> None:
    redis = RedisServer().start()
    doc = config({"chat": provider(upstream.base_url, {"kimi": "kimi-k2"})},
                 state={"backend": "redis", "url": redis.url, "sync_interval": 0.2})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = GatewayProcess(tmp_path / "a", doc).start()
    second = GatewayProcess(tmp_path / "b", doc).start()
    try:
        created = client(first).responses.create(model="kimi", input="shared")
        assert client(second).responses.retrieve(created.id).output_text == created.output_text
        client(second).responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            client(first).responses.retrieve(created.id)
    finally:
        first.stop()
        second.stop()
        redis.stop()
