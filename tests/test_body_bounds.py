"""Request bodies cannot grow a gateway without bound: the bytes every request's body holds at
once (queued or in flight) have a budget per process (`server.max_body_bytes_held`); past it a
new request gets 503 `overloaded` with `Retry-After` before its body is read, and a request
gives its bytes back however it ends. And a body that does not arrive in time is logged as what
the client got, a 408."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, hang, held, ok, status, stream_cut

MiB = 1024 * 1024
BODY_BYTES = 900_000  # each request's body: three fit in the budget below, a fourth does not
HELD_BUDGET = 3 * MiB


def big_body(stream: bool = False) -> bytes:
    """A chat request of about `BODY_BYTES`, as a client with a long document sends it."""
    head = {"model": "m", "stream": stream,
            "messages": [{"role": "user", "content": ""}]}
    padding = BODY_BYTES - len(json.dumps(head))
    head["messages"][0]["content"] = "a" * padding
    return json.dumps(head).encode()


def bounded(upstream: FakeUpstream, start_gateway: Callable[..., GatewayProcess]
            ) -> GatewayProcess:
    return start_gateway(config({"up": provider(upstream.base_url, {"m": "m"})},
                                server={"max_body_bytes": MiB,
                                        "max_body_bytes_held": HELD_BUDGET}))


def held_now(gateway: GatewayProcess) -> int:
    """The body bytes the gateway says it holds (its status page's queue)."""
    queue = httpx.get(f"{gateway.url}/status.json", timeout=5).json()["queue"]
    return int(queue["body_bytes_held"])


async def post(client: httpx.AsyncClient, gateway: GatewayProcess,
               body: bytes | AsyncIterator[bytes]) -> httpx.Response:
    return await client.post(f"{gateway.base_url}/chat/completions", content=body,
                             headers={"content-type": "application/json"})


async def chunked(body: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    """`body` sent without a Content-Length (chunked), as a client streaming an upload."""
    for at in range(0, len(body), size):
        yield body[at:at + size]


def test_many_large_bodies_to_a_slow_upstream_are_bounded_and_their_bytes_come_back(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("slow")
    gateway = bounded(upstream, start_gateway)
    upstream.set_mode(hang())

    async def flood() -> tuple[list[httpx.Response], list[asyncio.Task[httpx.Response]]]:
        async with httpx.AsyncClient(timeout=30) as client:
            tasks = [asyncio.create_task(post(client, gateway, big_body())) for _ in range(10)]
            # Three bodies fill the budget and wait on the upstream; the others are refused.
            await asyncio.to_thread(
                wait_until, lambda: sum(t.done() for t in tasks) == 7
                and len(upstream.requests) == 3, within=20, what="seven answers, three waiting")
            refused = [t.result() for t in tasks if t.done()]
            # A chunked body is refused too, once what it sent passes what is left.
            refused.append(await post(client, gateway, chunked(big_body())))
            waiting = [t for t in tasks if not t.done()]
            for task in waiting:  # their clients give up and leave
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            return refused, waiting

    refused, waiting = asyncio.run(flood())

    assert len(waiting) == 3
    for answer in refused:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "overloaded"
        assert int(answer.headers["retry-after"]) >= 1
        assert "max_body_bytes_held" in answer.json()["error"]["message"]
    assert len(upstream.requests) == 3, "no refused body reached the provider"
    # The clients that left gave their bytes back.
    wait_until(lambda: held_now(gateway) == 0, within=10, what="the bodies let go")

    async def three(stream: bool = False) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(post(client, gateway, big_body(stream))
                                          for _ in range(3)))

    upstream.set_mode(stream_cut(after_chunks=1))  # streams cut by the upstream mid-answer
    assert [a.status_code for a in asyncio.run(three(stream=True))] == [200] * 3
    wait_until(lambda: held_now(gateway) == 0, within=10, what="the cut streams' bodies let go")

    upstream.set_mode(status(500, "down"))  # failed requests
    assert {a.status_code for a in asyncio.run(three())} == {502}
    wait_until(lambda: held_now(gateway) == 0, within=10, what="the failed bodies let go")

    upstream.set_mode(held(ok("fine")))  # and answered ones: the whole budget is there again

    async def answered() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            tasks = [asyncio.create_task(post(client, gateway, big_body())) for _ in range(3)]
            await asyncio.to_thread(wait_until, lambda: len(upstream.requests) == 12,
                                    within=20, what="three more at the upstream")
            upstream.release()
            return await asyncio.gather(*tasks)

    assert [a.status_code for a in asyncio.run(answered())] == [200] * 3
    assert held_now(gateway) == 0


def test_small_bodies_under_the_budget_are_never_refused(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("fast")
    gateway = bounded(upstream, start_gateway)

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            small = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            return await asyncio.gather(*(post(client, gateway, small.encode())
                                          for _ in range(50)))

    assert {a.status_code for a in asyncio.run(many())} == {200}
    assert held_now(gateway) == 0


def test_a_body_that_never_arrives_is_logged_as_the_408_its_client_got(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("timely")
    gateway = start_gateway(config({"up": provider(upstream.base_url, {"m": "m"})},
                                   server={"body_timeout": 1.0}))

    async def stalled() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"X-Request-Id: stalled-body\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\"")
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(65536), timeout=20)
        finally:
            writer.close()

    received = asyncio.run(stalled())

    assert received.startswith(b"HTTP/1.1 408")
    line = gateway.request_line("stalled-body")
    assert line["status"] == 408, line
    assert upstream.requests == []
