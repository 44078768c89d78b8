"""The one answer path: the relay routes as plain ASGI, whole or streamed, the in-flight slot
taken and given back once however the answer ends."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.conftest import Pair
from tests.gateway_process import ROOT, GatewayProcess, config, provider
from tests.upstream import FakeUpstream, hang, ok, slow_first_token
from tests.waiting import wait_until

BODY = {"model": "chat-model", "messages": [{"role": "user", "content": "hello"}]}


def _inflight(gateway: GatewayProcess) -> int:
    value: int = httpx.get(f"{gateway.url}/ready").json()["inflight"]
    return value


def _settles_to_zero(gateway: GatewayProcess, what: str) -> None:
    wait_until(lambda: _inflight(gateway) == 0, within=30, what=what)


def test_under_any_asgi_server_the_relay_answers_whole_and_streamed(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    path = tmp_path / "llms.json"
    path.write_text(json.dumps(config({"up": provider(up.base_url, {"m": "m"})})))

    ran = subprocess.run([sys.executable, "-m", "tests.asgi_inprocess", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)

    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    whole, streamed, wrong_method = result["answers"]
    assert whole["status"] == 200 and whole["headers"]["x-llms-provider"] == "up"
    assert json.loads(whole["text"])["choices"][0]["message"]["content"] == "Hello from up"
    assert streamed["status"] == 200
    assert streamed["headers"]["content-type"].startswith("text/event-stream")
    assert streamed["headers"]["x-llms-provider"] == "up"
    events = [json.loads(line[6:]) for line in streamed["text"].splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == \
        "Hello from up"
    assert streamed["text"].rstrip().endswith("data: [DONE]")
    assert wrong_method["status"] == 405 and wrong_method["headers"]["allow"] == "POST"
    assert json.loads(wrong_method["text"])["error"]["code"] == "method_not_allowed"
    assert result["inflight"] == 0, "every answer gave its in-flight slot back"


def test_a_get_on_a_relay_route_is_405_with_allow_in_the_envelope(pair: Pair) -> None:
    answer = httpx.get(f"{pair.gateway.base_url}/chat/completions")

    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"
    assert answer.json()["error"]["code"] == "method_not_allowed"


def test_whole_streamed_failed_and_abandoned_answers_all_give_their_slot_back(
        pair: Pair) -> None:
    url = f"{pair.gateway.base_url}/chat/completions"
    assert httpx.post(url, json=BODY).status_code == 200
    with httpx.stream("POST", url, json={**BODY, "stream": True}) as streamed:
        assert streamed.status_code == 200
        streamed.read()
    assert httpx.post(url, json={**BODY, "model": "nobody-serves-this"}).status_code == 404
    assert httpx.post(url, content=b"{not json").status_code == 400

    # A client that leaves mid-stream, and one that leaves before the first token.
    pair.primary.set_mode(ok(chunks=["a", "b", "c"] * 200))
    with httpx.stream("POST", url, json={**BODY, "stream": True}) as streamed:
        next(streamed.iter_bytes())
    pair.primary.set_mode(slow_first_token(5))
    asked = len(pair.primary.requests)
    with socket.create_connection(("127.0.0.1", pair.gateway.port)) as sock:
        payload = json.dumps({**BODY, "stream": True}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(payload), payload))
        wait_until(lambda: len(pair.primary.requests) > asked,
                   what="the request waiting on the slow upstream")
    assert pair.primary.wait_for_cancel(), "the abandoned request was cancelled upstream"

    _settles_to_zero(pair.gateway, "every slot given back")


def test_a_client_that_leaves_a_hung_whole_request_frees_its_slot(pair: Pair) -> None:
    pair.primary.set_mode(hang())
    with socket.create_connection(("127.0.0.1", pair.gateway.port)) as sock:
        payload = json.dumps(BODY).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(payload), payload))
        wait_until(lambda: pair.primary.requests, what="the request held by the hung upstream")
        assert _inflight(pair.gateway) == 1

    assert pair.primary.wait_for_cancel()
    _settles_to_zero(pair.gateway, "the slot given back")
