"""A provider kind behind the gateway, the way every kind's test module sets it up.

Each module (tests/test_anthropic.py, test_google.py, test_vertex.py, test_bedrock.py,
test_azure.py) runs its kind's fake, the `backup` fake its aliases fail over to (a fixture of
tests/conftest.py), and one gateway in front of them that its tests share: `started` here. Each
test asks through `fresh_client`, its fakes answering as if new. The stories every kind tells
alike are told once, for each kind, in tests/test_kinds.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai

from tests.gateway_process import GatewayProcess, config
from tests.upstream import FakeUpstream


def started(folder: Path, providers: dict[str, Any],
            env: dict[str, str] | None = None) -> Iterator[GatewayProcess]:
    """A gateway over `providers` for a module's tests, stopped when they are done. Circuits
    are off: a test must not find a provider benched by the failures an earlier one caused."""
    gateway = GatewayProcess(folder, config(providers, defaults={"circuit": {"enabled": False}}),
                             env=env).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def fresh_client(gateway: GatewayProcess, *fakes: FakeUpstream) -> openai.OpenAI:
    """An OpenAI SDK client of `gateway` that never retries on its own, once `fakes` have
    forgotten what they were asked and answer as they do by default again."""
    for fake in fakes:
        fake.reset()
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
