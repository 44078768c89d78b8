"""The stream watchdog (`providers.wire.deadline.read_stream`): which timeout fires, and when it
must not.

Driven with aiohttp's StreamReader (what the transport's answers read from) fed by the test, on a
real event loop; times are short but the margins are several times the limits, so a slow machine
does not flip them.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from providers.contract.errors import FirstTokenTimeout, IdleTimeout, ProviderTimeout, TotalTimeout
from providers.contract.spec import Timeouts
from providers.wire.deadline import Deadline, read_stream

EVENT = b'data: {"choices": []}\n\n'


def _upstream() -> tuple[Any, aiohttp.StreamReader]:
    """A response whose body the test feeds, over a connection that stays open."""
    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    protocol.transport = SimpleNamespace(is_closing=lambda: False)  # type: ignore[assignment]
    reader = aiohttp.StreamReader(protocol, 2**16, loop=loop)
    return reader, reader


async def _read_all(response: Any, timeouts: Timeouts, pause: float = 0.0) -> list[bytes]:
    got = []
    async for chunk in read_stream(response, Deadline(timeouts)):
        got.append(chunk)
        await asyncio.sleep(pause)  # the client side taking its time with each chunk
    return got


async def _fed(reader: aiohttp.StreamReader, chunks: list[bytes], gap: float) -> None:
    for chunk in chunks:
        reader.feed_data(chunk)
        await asyncio.sleep(gap)
    reader.feed_eof()


@pytest.mark.parametrize(("timeouts", "feed", "expected"), [
    (Timeouts(first_token=0.1, idle=5, total=5), [], FirstTokenTimeout),
    (Timeouts(first_token=5, idle=0.1, total=5), [EVENT], IdleTimeout),
    (Timeouts(first_token=5, idle=5, total=0.3), [EVENT] * 50, TotalTimeout),
    # Comments and a line trickled a byte at a time are no first token, nor progress after one.
    (Timeouts(first_token=0.3, idle=5, total=5), [b": ping\n\n"] * 50, FirstTokenTimeout),
    (Timeouts(first_token=0.3, idle=5, total=5), [bytes([b]) for b in EVENT * 4],
     FirstTokenTimeout),
    (Timeouts(first_token=5, idle=0.3, total=5), [EVENT] + [b": ping\n\n"] * 50, IdleTimeout),
], ids=["no-first-token", "idle", "total", "pings-only", "trickle", "pings-after-data"])
def test_a_stalled_upstream_ends_with_the_timeout_that_names_the_phase(
        timeouts: Timeouts, feed: list[bytes], expected: type[ProviderTimeout]) -> None:
    async def scenario() -> None:
        response, reader = _upstream()
        for chunk in feed[:1]:
            reader.feed_data(chunk)
        feeder = asyncio.create_task(_fed(reader, feed[1:], 0.05)) if len(feed) > 1 else None
        with pytest.raises(expected):
            await asyncio.wait_for(_read_all(response, timeouts), 3)
        if feeder:
            feeder.cancel()

    asyncio.run(scenario())


def test_a_slow_client_does_not_count_against_the_upstream_idle_limit() -> None:
    async def scenario() -> list[bytes]:
        response, reader = _upstream()
        for chunk in (b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"):
            reader.feed_data(chunk)
            await asyncio.sleep(0)
        reader.feed_eof()
        # Each chunk is held 0.25 s downstream, past the 0.1 s idle limit; the upstream itself
        # never made the gateway wait.
        return await _read_all(response, Timeouts(first_token=5, idle=0.1, total=5), pause=0.25)

    assert b"".join(asyncio.run(scenario())) == b"data: a\n\ndata: b\n\ndata: c\n\n"


def test_a_steady_stream_runs_past_the_idle_limit_many_times_over() -> None:
    async def scenario() -> list[bytes]:
        response, reader = _upstream()
        feeder = asyncio.create_task(_fed(reader, [EVENT] * 20, 0.03))
        got = await _read_all(response, Timeouts(first_token=5, idle=0.15, total=5))
        await feeder
        return got

    assert b"".join(asyncio.run(scenario())) == EVENT * 20
