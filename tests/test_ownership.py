"""A stored response is continued only by the key that created it, and a delete holds on every
replica at once: `previous_response_id` naming another key's response, or one deleted anywhere,
is answered 404 `response_not_found` as an id never stored is, and nothing of it goes upstream."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, ok, status

ALICE, BOB, ADMIN = "alice-key-00001", "bob-key-000001", "admin-key-00001"
SECRET = "alice's travel plans: Lisbon on the 4th"


def _create(gateway: GatewayProcess, key: str | None, text: str,
            previous: str | None = None, stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {"model": "kimi", "input": text, "stream": stream}
    if previous is not None:
        body["previous_response_id"] = previous
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gateway.base_url}/responses", json=body, headers=headers, timeout=30)


def _sent_upstream(upstream: FakeUpstream) -> str:
    return " ".join(r.body.decode() for r in upstream.requests)


def _not_found(answer: httpx.Response, response_id: str) -> dict[str, Any]:
    """The error, with the id in its message made generic, to compare two ids' answers."""
    assert answer.status_code == 404, answer.text
    error: dict[str, Any] = answer.json()["error"]
    return {**error, "message": error["message"].replace(response_id, "ID")}


@pytest.fixture
def keyed(start_gateway: Callable[..., GatewayProcess],
          upstream_factory: Callable[[str], FakeUpstream]
          ) -> Iterator[tuple[GatewayProcess, FakeUpstream]]:
    upstream = upstream_factory("chat")
    yield start_gateway(config({"chat": provider(upstream.base_url, {"kimi": "kimi-k2"})},
                               server={"api_keys": [ALICE, BOB], "admin_keys": [ADMIN]})), upstream


@pytest.mark.parametrize("stream", [False, True])
def test_another_keys_response_is_not_continued_and_answers_as_an_unknown_id(
        keyed: tuple[GatewayProcess, FakeUpstream], stream: bool) -> None:
    gateway, upstream = keyed
    alices = _create(gateway, ALICE, SECRET).json()["id"]
    upstream.reset()

    borrowed = _create(gateway, BOB, "and what did I say before?", alices, stream)
    unknown = _create(gateway, BOB, "and what did I say before?", "resp_never_stored", stream)

    assert _not_found(borrowed, alices) == _not_found(unknown, "resp_never_stored")
    assert borrowed.json()["error"]["code"] == "response_not_found"
    assert borrowed.json()["error"]["param"] == "previous_response_id"
    assert SECRET not in _sent_upstream(upstream)
    retrieved = httpx.get(f"{gateway.base_url}/responses/{alices}",
                          headers={"Authorization": f"Bearer {BOB}"})
    assert retrieved.status_code == 404, "GET agrees: the id is unknown to this key"


def test_the_creator_continues_its_own_response(
        keyed: tuple[GatewayProcess, FakeUpstream]) -> None:
    gateway, upstream = keyed
    alices = _create(gateway, ALICE, SECRET).json()["id"]

    assert _create(gateway, ALICE, "and then?", alices).status_code == 200
    assert SECRET in _sent_upstream(upstream)


def test_a_failover_to_the_bridge_does_not_continue_another_keys_response(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    """An id the gateway does not hold for this key may be a native upstream's: it goes there,
    and when that upstream fails, the bridge behind it must not find the other key's turn."""
    native, chat = upstream_factory("native"), upstream_factory("chat")
    gateway = start_gateway(config(
        {"native": provider(native.base_url, {"kimi": "kimi-k2"}, responses=True),
         "chat": provider(chat.base_url, {"kimi": "kimi-k2"})},
        server={"api_keys": [ALICE, BOB]}))
    native.set_mode(status(500))
    alices = _create(gateway, ALICE, SECRET).json()["id"]
    chat.reset()

    borrowed = _create(gateway, BOB, "and what did I say before?", alices)

    assert borrowed.status_code == 404
    assert borrowed.json()["error"]["code"] == "response_not_found"
    assert SECRET not in _sent_upstream(chat)


@pytest.mark.skipif(not RedisServer.available(), reason="redis-server is not installed")
def test_a_response_deleted_on_one_replica_is_not_continued_on_another(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("chat")
    upstream.set_mode(ok("noted"))
    redis = RedisServer().start()
    doc = config({"chat": provider(upstream.base_url, {"kimi": "kimi-k2"})},
                 state={"backend": "redis", "url": redis.url, "sync_interval": 0.2})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = GatewayProcess(tmp_path / "a", doc).start()
    second = GatewayProcess(tmp_path / "b", doc).start()
    try:
        opening = _create(first, None, SECRET).json()["id"]
        reply = _create(first, None, "and a second thing", opening).json()["id"]
        kept = _create(first, None, "a conversation nobody deletes").json()["id"]

        assert httpx.delete(f"{second.base_url}/responses/{opening}").status_code == 200
        upstream.reset()

        for gone in (opening, reply):  # the deleted turn, and a turn continuing it
            answer = _create(first, None, "and then?", gone)
            assert answer.status_code == 404, f"{gone} was continued after its delete"
            assert answer.json()["error"]["code"] == "response_not_found"
        assert SECRET not in _sent_upstream(upstream)
        assert _create(first, None, "and then?", kept).status_code == 200
    finally:
        first.stop()
        second.stop()
        redis.stop()
