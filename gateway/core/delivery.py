"""What the pipeline hands the edge to send: a whole body or a stream, each with its record.

`gateway.edge.front` turns these framework-free values into ASGI messages and, once a whole body is
written, ends its record; a stream's generator ends its own record however it stops.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

import msgspec

from gateway.core.errors import AllProvidersFailed
from gateway.core.record import Outcome, Record
from providers.contract.errors import GatewayError, error_body
from providers.contract.log import get_logger
from providers.contract.redact import Redactor
from providers.contract.usage import Usage

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Structs, not frozen dataclasses: every request makes one, and a frozen dataclass sets each
# field through a Python-level `object.__setattr__`.
class Whole(msgspec.Struct, frozen=True):
    """A whole body, its bytes as they will be sent, and how the request ends once it is."""

    body: bytes
    headers: Mapping[str, str]
    record: Record
    status: int = 200
    media_type: str = "application/json"
    outcome: Outcome = Outcome.COMPLETED


class Streamed(msgspec.Struct, frozen=True):
    """A committed stream: its chunks (the first already at hand) and its headers. Whoever
    sends it must close its generator (`providers.contract.stream.close_quietly`): that ends
    its record."""

    chunks: AsyncGenerator[bytes, None]
    headers: Mapping[str, str]
    record: Record
    status: int = 200
    media_type: str = "text/event-stream"


def kept_stream(body: bytes, record: Record, usage: Usage | None = None,
                media_type: str = "text/event-stream") -> Streamed:
    """A stream kept whole (a cache hit, an idempotent replay), sent in one write; its record
    ends, with `usage`, once it is sent or its client left."""
    record.first_token()
    return Streamed(_once(body, record, usage), {**record.headers(), **STREAM_HEADERS}, record,
                    media_type=media_type)


async def _once(body: bytes, record: Record, usage: Usage | None
                ) -> AsyncGenerator[bytes, None]:
    outcome = Outcome.CLIENT_LEFT
    try:
        yield body
        outcome = Outcome.COMPLETED
    finally:
        record.end(outcome, usage)


def error_delivery(error: GatewayError, record: Record, redactor: Redactor) -> Whole:
    """An error as the client gets it: its status and headers, its body in the endpoint's
    dialect, redacted; the record says so."""
    record.status, record.error_code = error.status, error.code
    if isinstance(error, AllProvidersFailed):
        record.failed = error.attempts
    return Whole(redactor.encoded(error_body(error, record.dialect)),
                 {**record.headers(), **error.headers()}, record, error.status,
                 outcome=Outcome.ERROR)


def internal_error(record: Record, redactor: Redactor) -> Whole:
    """The answer to a bug: logged with its traceback and request id, a 500 envelope."""
    get_logger().exception("unhandled_error", request_id=record.request_id,
                           endpoint=record.endpoint)
    return error_delivery(GatewayError("Internal gateway error"), record, redactor)
