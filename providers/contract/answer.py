"""What a whole OpenAI-shaped answer must be before it is relayed: JSON of the right shape.

Used by the `openai` kind for the answers it relays, and by the gateway for a whole answer a
server sent where a stream was asked for (`gateway.adapters.assemble`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from providers.contract.errors import BadUpstreamResponse
from providers.contract.usage import Usage


class _ChoiceProbe(msgspec.Struct):
    index: int = 0
    finish_reason: str | None = None
    message: dict[str, Any] | None = None


class _AnswerProbe(msgspec.Struct):
    # Raw fields are checked as JSON but not built: the whole document is validated for the
    # price of a scan; `choices` is typed, as clients will read it.
    choices: list[_ChoiceProbe] | None = None
    output: msgspec.Raw = msgspec.Raw()
    error: msgspec.Raw = msgspec.Raw()
    usage: Usage | None = None


def _given(value: msgspec.Raw) -> bool:
    return len(value) > 0 and bytes(value) != b"null"


def check_json(body: bytes) -> Usage | None:
    """Fail over on a 200 whose body is not a JSON answer of the right shape (nor UTF-8);
    return its usage if it has one."""
    try:
        probe = msgspec.json.decode(body, type=_AnswerProbe)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise BadUpstreamResponse(f"response is not a JSON answer: {exc}") from None
    if _given(probe.error) and probe.choices is None and not _given(probe.output):
        raise BadUpstreamResponse("response is an error object with status 200")
    return probe.usage
