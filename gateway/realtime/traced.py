"""A Realtime session's span: one event per response (only with tracing on).

The session's span is the server span the edge serves it within (`Runtime.serving`), ended with
the session's record like a request's; each `response.done` adds an event to it with the
response's id, status, tokens by kind and cost. Never audio, never text.
"""

from __future__ import annotations

from typing import Any

from gateway.realtime.usage import Split


def response(response: Any, tokens: Split, dollars: float | None) -> None:
    """An event for one response on the current span."""
    from opentelemetry import trace  # imported by a traced gateway alone

    attributes: dict[str, str | int | float] = {
        "gen_ai.usage.input_tokens": tokens.input, "gen_ai.usage.output_tokens": tokens.output,
        "llms.realtime.audio_input_tokens": tokens.audio_in + tokens.cached_audio,
        "llms.realtime.audio_output_tokens": tokens.audio_out,
        "llms.realtime.cached_tokens": tokens.cached_text + tokens.cached_audio}
    if response.id:
        attributes["gen_ai.response.id"] = str(response.id)[:200]
    if response.status:
        attributes["llms.realtime.status"] = str(response.status)[:50]
    if dollars is not None:
        attributes["llms.cost"] = dollars
    trace.get_current_span().add_event("realtime.response", attributes)
