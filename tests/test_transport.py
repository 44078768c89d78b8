"""The transport boundary (`providers.transport`) against real local servers, and the rules that
decide how a provider is reached (`Link`, proxies from the environment and from llms.json).

Servers here are asyncio servers in the test's own loop, writing exactly the bytes a story
needs; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gateway import config
from providers.contract.errors import (
    BadUpstreamResponse,
    ConnectTimeout,
    GatewayError,
    ProviderUnavailable,
)
from providers.contract.spec import Timeouts
from providers.contract.transport import Link, ProxyEnvironment, TlsOptions, bypasses
from providers.transport import AiohttpTransport
from providers.wire.http import HttpUpstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _serve(handler: Handler) -> tuple[asyncio.AbstractServer, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                   if line.startswith(b"content-length:")), 0)
    return head + await reader.readexactly(length)


def test_an_answer_whose_head_never_ends_is_refused_not_buffered() -> None:
    async def endless_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(100_000):  # 100 MB of headers, were they all read
            writer.write(b"X-Filler: " + b"y" * 1000 + b"\r\n")
            await writer.drain()

    async def scenario() -> BadUpstreamResponse:
        server, url = await _serve(endless_head)
        async with server, AiohttpTransport() as transport:
            with pytest.raises(BadUpstreamResponse) as caught:
                await transport.request("GET", url + "/v1/models", headers={})
        return caught.value

    assert asyncio.run(scenario()).message.startswith("malformed HTTP response")


def test_a_late_failure_of_a_finished_answer_cannot_reach_the_next_request_on_its_connection(
        ) -> None:
    connections = 0

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(ANSWER)

    async def scenario() -> list[bytes]:
        server, url = await _serve(keep_alive)
        async with server, AiohttpTransport() as transport:
            first = await transport.request("GET", url, headers={})
            bodies = [await first.read()]
            first.close()
            # A stream's watchdog firing a turn late, and a second close, change nothing.
            first.set_exception(ConnectTimeout("late"))
            first.close()
            second = await transport.request("GET", url, headers={})
            bodies.append(await second.read())
            second.close()
        return bodies

    assert asyncio.run(scenario()) == [b"{}", b"{}"]
    assert connections == 1, "the second request went out on the kept connection"


def test_a_name_that_does_not_resolve_is_the_providers_failure_without_the_name() -> None:
    async def scenario() -> GatewayError:
        async with AiohttpTransport() as transport:
            with pytest.raises(GatewayError) as caught:
                await transport.request("GET", "http://internal-llm.invalid/v1/models",
                                        headers={}, connect_timeout=5)
        return caught.value

    failure = asyncio.run(scenario())

    assert isinstance(failure, (ProviderUnavailable, ConnectTimeout))
    assert "internal-llm" not in failure.message


def test_a_dead_proxy_is_named_and_its_credentials_are_not() -> None:
    async def scenario() -> GatewayError:
        server, _ = await _serve(lambda reader, writer: asyncio.sleep(0))
        port = server.sockets[0].getsockname()[1]
        server.close()  # nothing listens there now: connections are refused
        await server.wait_closed()
        link = Link(proxy=f"http://gateway:hunter2-secret@127.0.0.1:{port}")
        async with AiohttpTransport() as transport:
            with pytest.raises(GatewayError) as caught:
                await transport.request("GET", "https://api.example.com/v1/models",
                                        headers={}, link=link)
        return caught.value

    failure = asyncio.run(scenario())

    assert isinstance(failure, ProviderUnavailable)
    assert failure.message == "cannot connect to the proxy: Connection refused"
    assert failure.__suppress_context__ and failure.__cause__ is None, "no library error chained"


def test_reprs_never_show_proxy_credentials() -> None:
    link = Link(proxy="http://user:hunter2-secret@proxy.corp:3128", tls=TlsOptions(verify=False))
    environment = ProxyEnvironment.read({"HTTPS_PROXY": "http://u:hunter2-secret@proxy:8080",
                                         "NO_PROXY": "localhost"})
    snapshot = config.parse(json.dumps({"providers": {"p": {
        "type": "openai", "base_url": "https://api.example.com/v1", "models": {"m": "m"},
        "proxy": "http://user:hunter2-secret@proxy.corp:3128"}}}), Path("llms.json"), {})

    shown = " ".join((repr(link), str(link), repr(environment), repr(snapshot),
                      repr(snapshot.providers[0].link_for("https://api.example.com/v1"))))

    assert "hunter2" not in shown
    assert "http://***@proxy.corp:3128" in repr(link)


@pytest.mark.parametrize(("environ", "url", "expected"), [
    ({"HTTPS_PROXY": "http://p:1"}, "https://api.x.com/v1", "http://p:1"),
    ({"HTTPS_PROXY": "http://p:1"}, "http://api.x.com/v1", None),
    ({"HTTP_PROXY": "p:2"}, "http://api.x.com/v1", "http://p:2"),  # no scheme: http, as curl
    ({"ALL_PROXY": "http://all:3"}, "https://api.x.com/v1", "http://all:3"),
    ({"https_proxy": "http://lower:1", "HTTPS_PROXY": "http://upper:1"}, "https://a.b/",
     "http://lower:1"),
    ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "x.com"}, "https://api.x.com/v1", None),
    ({"HTTPS_PROXY": "http://p:1", "no_proxy": ".x.com"}, "https://x.com/v1", None),
    ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "ax.com"}, "https://x.com/v1", "http://p:1"),
    ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "http://10.2.3.4:8000/v1", None),
    ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost:8000"}, "http://localhost:8000/", None),
    ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "localhost:9000"}, "http://localhost:8000/",
     "http://p:1"),
    ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "*"}, "http://anything/", None),
    # A CGI-style parent may have set HTTP_PROXY from a client's header (httpoxy).
    ({"HTTP_PROXY": "http://p:1", "REQUEST_METHOD": "POST"}, "http://a.b/", None),
])
def test_the_environment_chooses_a_proxy_as_curl_does(
        environ: dict[str, str], url: str, expected: str | None) -> None:
    assert ProxyEnvironment.read(environ).proxy_for(url) == expected


def test_no_proxy_matches_ipv6_addresses_and_ranges() -> None:
    assert bypasses("::1", 80, "::1")
    assert bypasses("fd00::5", 443, "fd00::/8")
    assert not bypasses("2001:db8::1", 443, "fd00::/8,localhost")


def _parse(providers: dict[str, object], environ: dict[str, str] | None = None,
           **sections: object) -> config.Snapshot:
    return config.parse(json.dumps({"providers": providers, **sections}), Path("llms.json"),
                        environ or {})


def _openai(**extra: object) -> dict[str, object]:
    return {"type": "openai", "base_url": "https://api.example.com/v1", "models": {"m": "m"},
            **extra}


def test_a_socks_proxy_is_a_config_error_naming_where_it_came_from() -> None:
    with pytest.raises(config.ConfigError, match=r"providers\.p\.proxy: a socks5:// proxy"):
        _parse({"p": _openai(proxy="socks5://proxy:1080")})
    with pytest.raises(config.ConfigError, match=r"providers\.p: \$ALL_PROXY: a socks5h://"):
        _parse({"p": _openai()}, {"ALL_PROXY": "socks5h://u:pw@proxy:1080"})


def test_proxy_and_max_answer_bytes_resolve_per_provider() -> None:
    environ = {"HTTPS_PROXY": "http://env-proxy:8080", "CORP_PROXY": "http://corp:3128"}
    snapshot = _parse({
        "from-env": _openai(),
        "own": _openai(proxy="$CORP_PROXY", max_answer_bytes=1000),
        "unset-variable": _openai(proxy="$NOT_SET"),
        "direct": _openai(proxy=None),
    }, environ, defaults={"max_answer_bytes": 5000})

    links = {spec.name: spec.link_for(spec.base_url) for spec in snapshot.providers}

    assert links["from-env"] == Link("http://env-proxy:8080", None, 5000)
    assert links["own"] == Link("http://corp:3128", None, 1000)
    assert links["unset-variable"].proxy == "http://env-proxy:8080"
    assert links["direct"].proxy is None
    with pytest.raises(config.ConfigError, match=r"defaults\.max_answer_bytes"):
        _parse({"p": _openai()}, defaults={"max_answer_bytes": 0})
    with pytest.raises(config.ConfigError, match=r"providers\.p\.max_answer_bytes"):
        _parse({"p": _openai(max_answer_bytes=-1)})


def test_header_values_that_could_split_a_request_are_refused_when_the_provider_is_built(
        ) -> None:
    async def scenario() -> None:
        async with AiohttpTransport() as transport:
            with pytest.raises(ValueError, match="forbidden character"):
                HttpUpstream("p", Timeouts(), {"X-Team": "a\r\nX-Injected: 1"}, None, transport)

    asyncio.run(scenario())


def test_streams_ask_for_no_compression_unless_the_config_sets_accept_encoding() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await _read_request(reader)).lower())
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        server, url = await _serve(record)
        async with server, AiohttpTransport() as transport:
            for headers in ({}, {"accept-encoding": "gzip"}):
                response = await transport.request("POST", url, headers=headers, body=b"{}",
                                                   compressed=False)
                await response.read()
                response.close()

    asyncio.run(scenario())

    plain, configured = seen
    assert b"\r\naccept-encoding: identity\r\n" in plain
    assert configured.count(b"accept-encoding") == 1
    assert b"\r\naccept-encoding: gzip\r\n" in configured
