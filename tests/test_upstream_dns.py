"""Upstreams named by host name: looked up once for a burst, and a resolver that fails later or
an address that moved costs no request.

The lookups go through the system resolver (`resolver.system_lookup`) wrapped to count them or
to fail on cue: a DNS server is not cheap to run here, the upstream sockets are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from providers import wire
from providers.contract.errors import ProviderUnavailable
from providers.resolver import HostAddresses, system_lookup
from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
HEADERS = b"Content-Type: application/json\r\n"


class Resolver:
    """The system resolver, counted; answers from `script` while it lasts (an exception in it
    is raised), then the system's own; each answer after `delay` seconds."""

    def __init__(self, *script: Sequence[str] | Exception, delay: float = 0.01) -> None:
        self.script = list(script)
        self.delay = delay  # a resolver takes a while: concurrent connects overlap it
        self.calls = 0

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.script:
            answer = self.script.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return await system_lookup(host, port)


def test_a_burst_of_new_connections_to_a_named_upstream_looks_its_name_up_once(
        primary: FakeUpstream) -> None:
    primary.reset()
    lookups = Resolver()

    async def burst() -> list[int]:
        client = wire.Client(lookup=lookups)
        url = f"http://localhost:{primary.port}/v1/chat/completions"

        async def one() -> int:
            response = await client.request(b"POST", url, HEADERS, BODY, connect_timeout=5)
            await response.read()
            response.close()
            return response.status

        try:
            return await asyncio.gather(*(one() for _ in range(40)))
        finally:
            client.close()

    statuses = asyncio.run(burst())

    assert statuses == [200] * 40
    assert primary.connections == 40, "every request of the burst needed a connection"
    assert lookups.calls == 1


def _connect_all(addresses: HostAddresses, port: int, rounds: list[float],
                 connect_timeout: float = 5) -> list[str]:
    """Open (and close) one connection after each pause in `rounds`; what each attempt gave."""
    async def run() -> list[str]:
        pool = wire.Pool(wire.target(f"http://localhost:{port}/v1"), None, addresses=addresses)
        outcomes = []
        for pause in rounds:
            await asyncio.sleep(pause)
            try:
                conn = await pool.connect(connect_timeout)
            except ProviderUnavailable as exc:
                outcomes.append(exc.message)
            else:
                outcomes.append("connected")
                conn.close()
        return outcomes

    return asyncio.run(run())


def test_once_a_name_has_resolved_a_failing_resolver_stops_no_new_connection(
        primary: FakeUpstream) -> None:
    outage = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    # No delay: each background refresh is over long before the next connect.
    lookups = Resolver(["127.0.0.1"], outage, outage, ["127.0.0.1"], delay=0)
    addresses = HostAddresses("localhost", primary.port, ttl=0.05, lookup=lookups)

    # Each pause outlives the TTL: every connect after the first starts a refresh.
    outcomes = _connect_all(addresses, primary.port, [0, 0.1, 0.1, 0.1, 0.1])

    assert outcomes == ["connected"] * 5
    assert lookups.calls == 5, "the first lookup, then a refresh (two failing) at every connect"


def test_addresses_that_refuse_are_skipped_and_once_all_refuse_the_name_is_looked_up_again(
        primary: FakeUpstream) -> None:
    # 127.0.0.2 is loopback too, but the upstream listens on 127.0.0.1 only.
    lookups = Resolver(["127.0.0.2", "127.0.0.1"], ["127.0.0.2"], ["127.0.0.1"])
    addresses = HostAddresses("localhost", primary.port, ttl=60, lookup=lookups)

    first = _connect_all(addresses, primary.port, [0])
    addresses.forget()  # as if the TTL had run out
    moved = _connect_all(addresses, primary.port, [0, 0, 0])

    assert first == ["connected"] and lookups.calls == 3
    assert moved == ["cannot connect: Connection refused", "connected", "connected"]


@contextlib.contextmanager
def _dropping_connections(host: str, port: int) -> Iterator[None]:
    """A listener at host:port whose accept queue is full and never drained: the kernel drops
    further connection attempts, as a dead route does."""
    listener = socket.create_server((host, port), backlog=0)
    queued = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((host, port))
            queued.append(filler)
        yield
    finally:
        for filler in queued:
            filler.close()
        listener.close()


def test_an_address_that_drops_connection_attempts_leaves_time_for_the_next_and_goes_last(
        primary: FakeUpstream) -> None:
    lookups = Resolver(["127.0.0.2", "127.0.0.1"], ["127.0.0.2", "127.0.0.1"])
    addresses = HostAddresses("localhost", primary.port, ttl=60, lookup=lookups)

    with _dropping_connections("127.0.0.2", primary.port):
        # Given all of the 1 s, the dead address would leave the live one nothing.
        outcomes = _connect_all(addresses, primary.port, [0], connect_timeout=1)
        order = asyncio.run(addresses.get())
        addresses.forget()  # as if the TTL had run out
        order_after_a_lookup = asyncio.run(addresses.get())

    assert outcomes == ["connected"]
    assert lookups.calls == 2
    assert order == order_after_a_lookup == ("127.0.0.1", "127.0.0.2"), (
        "last, even after the resolver named it first again")


def test_a_name_that_does_not_resolve_fails_over_like_a_refused_connection(
        start_gateway: Callable[..., GatewayProcess], secondary: FakeUpstream,
        tmp_path: Path) -> None:
    secondary.reset()
    # .invalid never resolves (RFC 2606); the timeout bounds a resolver that is slow to say so.
    nowhere = provider("http://no-such-upstream.invalid/v1", {"m": "m"},
                       timeouts={"connect": 2})
    gateway = start_gateway(config({"nowhere": nowhere,
                                    "secondary": provider(secondary.base_url, {"m": "m"})}))

    answer = httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)

    assert answer.status_code == 200
    assert answer.headers["x-llms-provider"] == "secondary"
    assert answer.headers["x-llms-attempts"] == "2"
    logged = gateway.wait_for_log("request")[-1]
    assert logged["failed"] in (["nowhere:unavailable"], ["nowhere:connect_timeout"])


@pytest.mark.parametrize("answer", [[], socket.gaierror(socket.EAI_NONAME, "Name unknown"),
                                    UnicodeError("label too long")])
def test_a_name_with_no_address_is_the_providers_failure_without_the_name(
        answer: Sequence[str] | Exception) -> None:
    addresses = HostAddresses("internal-llm.corp.example", 443, lookup=Resolver(answer))

    with pytest.raises(ProviderUnavailable) as raised:
        asyncio.run(addresses.get())

    assert raised.value.message == "cannot resolve the provider's host name"
