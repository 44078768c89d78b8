"""An upstream's stream read and translated into OpenAI chat chunks: the one loop every kind uses.

What each kind knows is pure: a `Translator` fed the upstream's bytes as they come, giving back
the chunks (SSE bytes) they make whole, and at the clean end whatever its framing still holds.
The I/O is here, once: read, translate, pass on what there is, and close the upstream request
however the reading stops (a client gone, an error, the end). `HttpUpstream.stream` runs the
same loop itself when handed the translator: one generator less to pass each chunk through.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol


class Translator(Protocol):
    """A kind's stream, from the upstream's framing to OpenAI chat chunks; raises the
    `ProviderError` an error event stands for."""

    def feed(self, chunk: bytes) -> bytes:
        """The chunks for every event made whole by `chunk` (b"" while none is)."""
        ...

    def close(self) -> bytes:
        """At the upstream's clean end: what is left (a last event, usage, `[DONE]`)."""
        ...


async def translated(chunks: AsyncGenerator[bytes, None], translator: Translator
                     ) -> AsyncGenerator[bytes, None]:
    """`chunks` as `translator` makes them, each piece as soon as it has one; the upstream is
    closed when this stops, however it stops."""
    try:
        async for chunk in chunks:
            if out := translator.feed(chunk):
                yield out
        if tail := translator.close():
            yield tail
    finally:
        await chunks.aclose()
