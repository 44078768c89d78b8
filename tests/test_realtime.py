"""The Realtime API through the gateway: a voice session is governed like a request.

A client opens `/v1/realtime?model=...` as a WebSocket (OpenAI's SDK, a browser with the
subprotocol token, a plain WebSocket client); the gateway checks its key before dialling, dials
the alias's Realtime candidates in order, relays the session's frames both ways, charges each
`response.done`'s usage to the key's budgets, and ends the session with one record. The
upstream is a fake that speaks the protocol (`tests/fake_realtime.py`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests import browser
from tests.fake_realtime import AUDIO_CHUNK, TEXT, USAGE, FakeRealtime
from tests.gateway_process import (
    ROOT,
    GatewayProcess,
    config,
    dies_with_us,
    free_port,
    provider,
)
from tests.test_teams import Admin
from tests.waiting import wait_until

CLIENT_KEY = "sk-client-key-abcdef123456"
UPSTREAM_KEY = "sk-test-secret-123456"  # tests.gateway_process.provider's
PRICE = {"input": 4.0, "output": 16.0, "cached_input": 0.4, "audio_input": 32.0,
         "audio_output": 64.0}
# What the fake's usage costs at PRICE: fresh text in, cached text, audio in, text and audio out.
RESPONSE_COST = (10 * 4.0 + 10 * 0.4 + 100 * 32.0 + 30 * 16.0 + 50 * 64.0) / 1_000_000


def realtime_model(upstream: str = "gpt-realtime") -> dict[str, Any]:
    return {"id": upstream, "realtime": True, "price": PRICE}


@pytest.fixture
def fakes() -> Iterator[Callable[[str], FakeRealtime]]:
    started: list[FakeRealtime] = []

    def make(name: str) -> FakeRealtime:
        fake = FakeRealtime(name).start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop()


def ws_url(gateway: GatewayProcess, model: str = "voice") -> str:
    return f"ws://127.0.0.1:{gateway.port}/v1/realtime?model={model}"


async def until_done(ws: ClientConnection) -> list[dict[str, Any]]:
    """The server events up to and including `response.done`."""
    events = []
    while True:
        event = json.loads(await ws.recv())
        events.append(event)
        if event["type"] in ("response.done", "error"):
            return events


# -- the SDK's session --------------------------------------------------------------------------


def test_the_openai_sdk_runs_a_voice_session_through_the_gateway_with_the_provider_s_key(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}, server={"api_keys": [CLIENT_KEY]}))
    spoken = os.urandom(3 * AUDIO_CHUNK + 1000)

    async def session() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=CLIENT_KEY)
        events = []
        async with client.realtime.connect(model="voice") as connection:
            await connection.session.update(session={"type": "realtime",
                                                     "instructions": "be brief"})
            for start in range(0, len(spoken), 20_000):
                await connection.input_audio_buffer.append(
                    audio=base64.b64encode(spoken[start:start + 20_000]).decode())
            await connection.response.create()
            async for event in connection:
                events.append(event)
                if event.type == "response.done":
                    break
        return events

    events = asyncio.run(session())

    kinds = [event.type for event in events]
    assert kinds[:2] == ["session.created", "session.updated"], kinds
    text = [e.delta for e in events if e.type == "response.output_text.delta"]
    audio = b"".join(base64.b64decode(e.delta) for e in events
                     if e.type == "response.output_audio.delta")
    assert text == TEXT, "text deltas in order and intact"
    assert audio == spoken, "audio deltas in order and intact"
    assert events[-1].response.usage.total_tokens == USAGE["total_tokens"]
    handshake = fake.handshakes[-1]
    assert handshake.authorization == f"Bearer {UPSTREAM_KEY}", "the provider's key upstream"
    assert CLIENT_KEY not in json.dumps(handshake.__dict__)
    assert handshake.query == {"model": "gpt-realtime"} and handshake.beta is None
    assert fake.received[0] == "session.update" and fake.received[-1] == "response.create"

    line = gateway.wait_for_log("request")[-1]
    assert line["endpoint"] == "realtime" and line["provider"] == "openai", line
    assert line["tokens"] == USAGE["total_tokens"] and line["responses"] == 1
    assert line["cost"] == pytest.approx(RESPONSE_COST)
    assert line["frames_in"] == len(fake.received) and line["outcome"] == "completed"
    assert line["audio_output_tokens"] == 50
    assert "delta" not in json.dumps(line) and "be brief" not in gateway.logs(), \
        "no audio nor text in the log"


def test_a_beta_client_s_header_reaches_the_upstream(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}))

    async def session() -> list[dict[str, Any]]:
        async with connect(ws_url(gateway), additional_headers={
                "OpenAI-Beta": "realtime=v1"}) as ws:
            await ws.send(json.dumps({"type": "response.create"}))
            return await until_done(ws)

    events = asyncio.run(session())
    assert [e["delta"] for e in events if e["type"] == "response.text.delta"] == TEXT
    assert fake.handshakes[-1].beta == "realtime=v1"


# -- failover at connect ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_a_provider_that_refuses_or_never_answers_the_handshake_is_failed_over(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime], fault: str) -> None:
    first, second = fakes("first"), fakes("second")
    first.set_mode(fault)
    gateway = start_gateway(config({
        "first": provider(first.base_url, {"voice": realtime_model()},
                          timeouts={"connect": 1}),
        "second": provider(second.base_url, {"voice": realtime_model()})}))

    async def session() -> list[dict[str, Any]]:
        async with connect(ws_url(gateway)) as ws:
            await ws.send(json.dumps({"type": "response.create"}))
            return await until_done(ws)

    events = asyncio.run(session())
    assert events[-1]["type"] == "response.done"
    assert len(first.handshakes) == 1 and len(second.handshakes) == 1
    line = gateway.wait_for_log("request")[-1]
    expected = "unavailable" if fault == "refuse" else "connect_timeout"
    assert line["failed"] == [f"first:{expected}"] and line["provider"] == "second", line


def test_a_voice_agent_finds_which_provider_served_its_session_by_the_request_id_it_sent(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    # Under granian, the server `gateway serve` runs, the handshake's answer carries no header
    # of the app's (docs/realtime.md, "Known limits"): the id the client sent is its handle.
    first, second = fakes("first"), fakes("second")
    first.set_mode("refuse")
    gateway = start_gateway(config({
        "first": provider(first.base_url, {"voice": realtime_model()}),
        "second": provider(second.base_url, {"voice": realtime_model("gpt-realtime-2")})},
        server={"api_keys": [CLIENT_KEY]}, logs={}))
    request_id = f"voice-call-{os.urandom(4).hex()}"

    async def session() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key=CLIENT_KEY)
        events = []
        async with client.realtime.connect(model="voice", extra_headers={
                "x-request-id": request_id}) as connection:
            await connection.response.create()
            async for event in connection:
                events.append(event)
                if event.type == "response.done":
                    break
        return events

    events = asyncio.run(session())
    assert events[-1].type == "response.done"
    assert second.handshakes[-1].query == {"model": "gpt-realtime-2"}, "the second served"

    found = httpx.get(f"{gateway.url}/admin/logs/{request_id}", timeout=10)
    assert found.status_code == 200, found.text
    row = found.json()
    assert row["provider"] == "second" and row["alias"] == "voice", row
    assert row["endpoint"] == "realtime" and row["model"] == "gpt-realtime-2", row
    assert [(a["provider"], a["outcome"], a.get("status")) for a in row["attempts"]] == [
        ("first", "failed", 503), ("second", "answered", None)], row["attempts"]
    assert gateway.request_line(request_id)["provider"] == "second"


@pytest.fixture
def uvicorn_gateway(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], str]]:
    """The gateway's app under uvicorn, a server that puts an accept's headers on its 101
    answer; its URL."""
    started: list[subprocess.Popen[bytes]] = []

    def start(doc: dict[str, Any]) -> str:
        path, port = tmp_path / "llms.json", free_port()
        path.write_text(json.dumps(doc))
        env = {**{k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
               "LLMS_CONFIG": str(path), "XDG_STATE_HOME": str(tmp_path / "state")}
        logged = tmp_path / "uvicorn.log"
        with logged.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "gateway.app:create_app", "--factory",
                 "--host", "127.0.0.1", "--port", str(port), "--ws", "websockets-sansio",
                 "--lifespan", "on", "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=dies_with_us)
        started.append(process)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert process.poll() is None, f"uvicorn exited:\n{logged.read_text()}"
            try:
                return httpx.get(f"{url}/health", timeout=0.5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, within=60, what="the gateway under uvicorn answering /health")
        return url

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_under_a_server_that_honours_accept_headers_the_handshake_names_the_provider(
        uvicorn_gateway: Callable[[dict[str, Any]], str],
        fakes: Callable[[str], FakeRealtime]) -> None:
    first, second = fakes("first"), fakes("second")
    first.set_mode("refuse")
    url = uvicorn_gateway(config({
        "first": provider(first.base_url, {"voice": realtime_model()}),
        "second": provider(second.base_url, {"voice": realtime_model()})}))

    async def session() -> tuple[Any, list[dict[str, Any]]]:
        async with connect(f"ws{url.removeprefix('http')}/v1/realtime?model=voice",
                           additional_headers={"x-request-id": "voice-call-2"}) as ws:
            await ws.send(json.dumps({"type": "response.create"}))
            assert ws.response is not None
            return ws.response.headers, await until_done(ws)

    headers, events = asyncio.run(session())
    assert events[-1]["type"] == "response.done"
    assert headers["x-llms-provider"] == "second" and headers["x-llms-model"] == "voice"
    assert headers["x-request-id"] == "voice-call-2"
    assert len(first.handshakes) == 1 and len(second.handshakes) == 1


def test_an_upstream_that_drops_mid_session_closes_the_client_with_1011(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    fake.set_mode("drop", after=2)
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}))

    async def session() -> ConnectionClosed:
        async with connect(ws_url(gateway)) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": {}}))
            await ws.send(json.dumps({"type": "session.update", "session": {}}))
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await ws.recv()
            return closed.value

    closed = asyncio.run(session())
    assert closed.rcvd is not None and closed.rcvd.code == 1011
    assert "upstream connection lost" in closed.rcvd.reason
    line = gateway.wait_for_log("request")[-1]
    assert line["outcome"] == "error" and line["error"] == "upstream_closed", line


# -- keys, limits and budgets -------------------------------------------------------------------


def test_a_wrong_key_is_refused_before_any_upstream_is_dialled(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model(), "chat": "gpt-4o"})}, server={"api_keys": [CLIENT_KEY]}))

    async def refused(headers: dict[str, str], model: str = "voice"
                      ) -> tuple[dict[str, Any], int]:
        async with connect(ws_url(gateway, model), additional_headers=headers) as ws:
            event = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            return event, closed.value.rcvd.code

    event, code = asyncio.run(refused({"Authorization": "Bearer sk-wrong-key-123456789"}))
    assert event["type"] == "error" and event["error"]["code"] == "invalid_api_key"
    assert code == 1008
    event, code = asyncio.run(refused({"Authorization": f"Bearer {CLIENT_KEY}"}, "chat"))
    assert event["error"]["code"] == "model_not_found", "a model that is not Realtime's"
    assert not fake.handshakes


def test_a_key_opens_no_more_sessions_than_its_limit(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}, realtime={"max_sessions_per_key": 1}))

    async def two() -> dict[str, Any]:
        async with connect(ws_url(gateway)) as first:
            assert json.loads(await first.recv())["type"] == "session.created"
            async with connect(ws_url(gateway)) as second:
                refusal: dict[str, Any] = json.loads(await second.recv())
            await first.send(json.dumps({"type": "response.create"}))
            assert (await until_done(first))[-1]["type"] == "response.done"
            return refusal

    refusal = asyncio.run(two())
    assert refusal["error"]["code"] == "rate_limit_exceeded", refusal
    assert len(fake.handshakes) == 1


def test_a_quiet_session_is_ended_at_its_idle_timeout(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}, realtime={"idle_timeout": 1}))

    async def quiet() -> tuple[list[dict[str, Any]], int]:
        async with connect(ws_url(gateway)) as ws:
            events = [json.loads(await ws.recv()), json.loads(await ws.recv())]
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            return events, closed.value.rcvd.code

    events, code = asyncio.run(quiet())
    assert events[1]["type"] == "error"
    assert events[1]["error"]["code"] == "session_idle_timeout" and code == 1008
    wait_until(lambda: fake.sessions == 0, what="the upstream session closed")


def test_a_small_budget_ends_the_session_with_an_error_event_and_spend_equals_usage(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}))
    admin = Admin(gateway)
    made = admin.key(budget={"usd": 0.01, "period": "month"})

    async def session() -> tuple[list[dict[str, Any]], int]:
        async with connect(ws_url(gateway), additional_headers={
                "Authorization": f"Bearer {made['key']}"}) as ws:
            await ws.send(json.dumps({"type": "response.create"}))
            first = await until_done(ws)
            assert first[-1]["type"] == "response.done"
            await ws.send(json.dumps({"type": "response.create"}))
            second = await until_done(ws)
            ended = json.loads(await ws.recv())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None
            return [*second, ended], closed.value.rcvd.code

    events, code = asyncio.run(session())
    assert events[-2]["type"] == "response.done", "the response that spent it is delivered"
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "budget_exceeded"
    assert code == 1008

    row = wait_until(lambda: admin.spend().get(made["id"]), what="the session's spend row")
    assert row["cost"] == pytest.approx(2 * RESPONSE_COST)
    assert row["prompt_tokens"] == 2 * USAGE["input_tokens"]
    assert row["completion_tokens"] == 2 * USAGE["output_tokens"]

    async def again() -> dict[str, Any]:
        async with connect(ws_url(gateway), additional_headers={
                "Authorization": f"Bearer {made['key']}"}) as ws:
            refusal: dict[str, Any] = json.loads(await ws.recv())
            return refusal

    assert asyncio.run(again())["error"]["code"] == "budget_exceeded"
    assert len(fake.handshakes) == 1, "a spent budget opens no upstream"


def test_a_key_given_as_the_browser_s_subprotocol_opens_a_session(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}, server={"api_keys": [CLIENT_KEY]}))

    async def session() -> tuple[str | None, list[dict[str, Any]]]:
        async with connect(ws_url(gateway), subprotocols=[  # type: ignore[list-item]
                "realtime", f"openai-insecure-api-key.{CLIENT_KEY}"]) as ws:
            await ws.send(json.dumps({"type": "response.create"}))
            return ws.subprotocol, await until_done(ws)

    protocol, events = asyncio.run(session())
    assert protocol == "realtime" and events[-1]["type"] == "response.done"
    assert fake.handshakes[-1].authorization == f"Bearer {UPSTREAM_KEY}"


# -- a browser ----------------------------------------------------------------------------------

PAGE = """<!doctype html><script>
window.result = null;
const ws = new WebSocket(URL_, ["realtime", "openai-insecure-api-key." + KEY]);
const deltas = [];
ws.onopen = () => ws.send(JSON.stringify({type: "response.create"}));
ws.onmessage = (m) => {
  const event = JSON.parse(m.data);
  if (event.type === "response.output_text.delta") deltas.push(event.delta);
  if (event.type === "response.done")
    window.result = {protocol: ws.protocol, text: deltas.join(""),
                     tokens: event.response.usage.total_tokens};
};
ws.onclose = (e) => { if (!window.result) window.result = {closed: e.code}; };
</script>"""


@pytest.mark.skipif(browser.CHROMIUM is None, reason="Chromium is not installed")
def test_a_browser_opens_a_session_with_the_subprotocol_token(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime], tmp_path: Path) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}, server={"api_keys": [CLIENT_KEY],
                                              "cors_origins": [fake.origin]}))
    fake.pages["rt"] = PAGE.replace("URL_", json.dumps(ws_url(gateway))) \
        .replace("KEY", json.dumps(CLIENT_KEY))

    async def drive(port: int) -> Any:
        async with browser.open_page(port) as page:
            await page.goto(f"{fake.origin}/page/rt")
            return await page.wait_for("window.result")

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(drive(port))

    assert seen == {"protocol": "realtime", "text": "".join(TEXT),
                    "tokens": USAGE["total_tokens"]}, seen
    assert fake.handshakes[-1].authorization == f"Bearer {UPSTREAM_KEY}"


# -- many sessions ------------------------------------------------------------------------------


def _rss(pid: int) -> int:
    """Resident bytes of `pid` and its children (granian's workers)."""
    total = 0
    for each in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except FileNotFoundError:
            continue
    return total


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        found += [int(child) for child in children]
    return found + [grand for child in found for grand in _children(child)]


def test_fifty_sessions_relay_a_megabyte_each_with_no_frame_lost_and_bounded_memory(
        start_gateway: Callable[..., GatewayProcess],
        fakes: Callable[[str], FakeRealtime]) -> None:
    fake = fakes("openai")
    gateway = start_gateway(config({"openai": provider(fake.base_url, {
        "voice": realtime_model()})}, realtime={"max_sessions_per_key": 50}))
    assert gateway.process is not None
    pid = gateway.process.pid
    before = _rss(pid)
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], _rss(pid))

    async def one(number: int) -> bool:
        spoken = os.urandom(1024 * 1024)
        async with connect(ws_url(gateway), max_size=None) as ws:
            for start in range(0, len(spoken), 64 * 1024):
                chunk = base64.b64encode(spoken[start:start + 64 * 1024]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": chunk}))
            await ws.send(json.dumps({"type": "response.create"}))
            events = await until_done(ws)
        heard = b"".join(base64.b64decode(e["delta"]) for e in events
                         if e["type"] == "response.output_audio.delta")
        return heard == spoken

    async def all_of_them() -> list[bool]:
        return await asyncio.gather(*(one(n) for n in range(50)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        intact = asyncio.run(all_of_them())
    finally:
        stop.set()
        sampler.join()
    assert all(intact), f"{intact.count(False)} sessions lost or changed frames"
    assert fake.received.count("input_audio_buffer.append") == 50 * 16, "every frame relayed"
    grown = peak[0] - before
    print(f"gateway RSS {before / 2**20:.0f} MiB before, peak {peak[0] / 2**20:.0f} MiB")
    # 100 MiB went through it (50 MiB each way, base64): it holds a few frames per session.
    assert grown < 80 * 2**20, f"the gateway grew by {grown / 2**20:.0f} MiB"
