"""Shared fixtures: fake upstreams on real sockets, and the real gateway in front of them.

Most tests use `pair`: one gateway serving alias `chat-model` from `primary` then `secondary`
(file order), so failover is visible in which fake got the request. Tests that need another
config start their own gateway with `start_gateway`.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.fake_anthropic import FakeAnthropic
from tests.fake_gemini import FakeGemini
from tests.fake_ollama import FakeOllama
from tests.gateway_process import GatewayProcess, config, provider
from tests.redis_server import RedisServer
from tests.upstream import FakeUpstream, Reply, Scripted

if TYPE_CHECKING:
    from tests.fake_mcp import FakeMcp

# What the gateway keeps (its accounts database, worker logs) goes to the run's own folder, never
# the home directory: a gateway run in-process, or by a helper script, reads the environment
# (`GatewayProcess` gives each gateway a folder of its own). Before any test module is imported.
# A developer's own `LLMS_STATE_DIR` (which wins over XDG_STATE_HOME) would put every test's
# gateway in one folder, sharing keys, files and spend: the tests give their own.
os.environ.pop("LLMS_STATE_DIR", None)
os.environ["XDG_STATE_HOME"] = _STATE = tempfile.mkdtemp(prefix="llms-gateway-tests-state-")
atexit.register(shutil.rmtree, _STATE, True)


@dataclass
class Pair:
    """A gateway in front of two fake upstreams, primary first."""

    gateway: GatewayProcess
    primary: FakeUpstream
    secondary: FakeUpstream

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.base_url, api_key="unused", max_retries=0,
                             **kwargs)

    def async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.gateway.base_url, api_key="unused",
                                  max_retries=0, **kwargs)

    def stream_lines(self) -> list[str]:
        """The non-empty lines of a streamed `chat-model` answer (asserting a 200)."""
        body = {"model": "chat-model", "messages": [{"role": "user", "content": "hello"}],
                "stream": True}
        with httpx.stream("POST", f"{self.gateway.base_url}/chat/completions",
                          json=body) as resp:
            assert resp.status_code == 200
            return [line for line in resp.iter_lines() if line]


def pair_config(primary: FakeUpstream, secondary: FakeUpstream) -> dict[str, Any]:
    return config({
        "primary": provider(primary.base_url, {"chat-model": "primary-upstream-id",
                                               "primary-only": "primary-only"}),
        "secondary": provider(secondary.base_url, {"chat-model": "secondary-upstream-id"}),
    }, defaults={"circuit": {"enabled": False}})  # tests share this gateway: no memory between them


@pytest.fixture(scope="session")
def primary() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="primary") as upstream:
        yield upstream


@pytest.fixture(scope="session")
def secondary() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="secondary") as upstream:
        yield upstream


@pytest.fixture(scope="module")
def backup() -> Iterator[FakeUpstream]:
    """An OpenAI-compatible fake, a module's own, that its aliases fail over to: it answers
    "Hello from backup"."""
    with FakeUpstream(name="backup") as fake:
        yield fake


@pytest.fixture(scope="session")
def pair_gateway(tmp_path_factory: pytest.TempPathFactory, primary: FakeUpstream,
                 secondary: FakeUpstream) -> Iterator[GatewayProcess]:
    gateway = GatewayProcess(tmp_path_factory.mktemp("pair"), pair_config(primary, secondary))
    gateway.start()
    yield gateway
    gateway.stop()


@pytest.fixture
def pair(pair_gateway: GatewayProcess, primary: FakeUpstream, secondary: FakeUpstream) -> Pair:
    primary.reset()
    secondary.reset()
    return Pair(pair_gateway, primary, secondary)


@pytest.fixture(scope="session")
def every_kind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway with a provider of every kind that speaks HTTP, each on its own fake:
    aliases `openai-m`, `anthropic-m`, `google-m`, `ollama-m`."""
    with FakeUpstream(name="oa") as oa, FakeAnthropic(name="an") as an, \
            FakeGemini(name="gm") as gm, FakeOllama(name="ol") as ol:
        gateway = GatewayProcess(tmp_path_factory.mktemp("kinds"), config({
            "openai": provider(oa.base_url, {"openai-m": "m"}),
            "anthropic": {"type": "anthropic", "base_url": an.base_url.removesuffix("/v1"),
                          "api_key": "an-key-000000", "models": {"anthropic-m": "m"}},
            "google": {"type": "google", "base_url": gm.base_url, "api_key": "gm-key-000000",
                       "models": {"google-m": "gemini-2.5-flash"}},
            "ollama": {"type": "ollama", "base_url": ol.base_url, "models": {"ollama-m": "m"}},
        }, defaults={"circuit": {"enabled": False}}))
        gateway.start()
        yield gateway
        gateway.stop()


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []

    def start(doc: dict[str, Any], **kwargs: Any) -> GatewayProcess:
        gateway = GatewayProcess(tmp_path, doc, **kwargs)
        started.append(gateway)
        return gateway.start()

    yield start
    for gateway in started:
        gateway.stop()


@pytest.fixture(scope="module")
def remote() -> Iterator[FakeMcp]:
    """An MCP server a module's gateway names `remote`, written with the SDK's server side."""
    from tests.fake_mcp import FakeMcp  # the SDK is loaded by the modules that use one

    with FakeMcp("remote") as fake:
        yield fake


@pytest.fixture(scope="module")
def other() -> Iterator[FakeMcp]:
    """A second MCP server, named `other`."""
    from tests.fake_mcp import FakeMcp

    with FakeMcp("other") as fake:
        yield fake


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may kill and restart."""
    if not RedisServer.available():
        pytest.skip("redis-server not installed")
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def upstream_factory() -> Iterator[Callable[[str], FakeUpstream]]:
    made: list[FakeUpstream] = []

    def make(name: str) -> FakeUpstream:
        upstream = FakeUpstream(name=name).start()
        made.append(upstream)
        return upstream

    yield make
    for upstream in made:
        upstream.stop()


@pytest.fixture
def scripted() -> Iterator[Callable[[Reply], tuple[str, dict[str, int]]]]:
    """Start raw upstreams answering with a given `reply` (`tests.upstream.Scripted`); each
    start gives its base URL and its counts of connections and requests."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers: list[asyncio.AbstractServer] = []

    def start(reply: Reply) -> tuple[str, dict[str, int]]:
        counts = {"connections": 0, "requests": 0}
        sock = socket.create_server(("127.0.0.1", 0))
        made = asyncio.run_coroutine_threadsafe(
            loop.create_server(lambda: Scripted(reply, counts), sock=sock), loop)
        servers.append(made.result(5))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1", counts

    yield start
    for server in servers:
        loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
