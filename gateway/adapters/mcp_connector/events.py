"""The gateway's MCP tool loop as a Messages stream, as Anthropic streams its MCP connector's:
`message_start`, then each content block as the loop makes it (`content_block_start`, its
deltas, `content_block_stop`: the model's text, an `mcp_tool_use` once asked for, its
`mcp_tool_result` once answered), the model's final blocks, `message_delta` and `message_stop`
(pure but for the loop it reads)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import Any

import msgspec

from gateway.adapters.mcp_loop import Event, written
from gateway.adapters.messages import event
from gateway.core.messages import new_id
from providers.contract.errors import Dialect, GatewayError, ProviderUnavailable, error_event

TOOL_INPUT = ("tool_use", "server_tool_use", "mcp_tool_use")  # whose input comes as JSON deltas


def streamed(model: str, early: list[Event], events: AsyncGenerator[Event, None]
             ) -> AsyncGenerator[bytes, None]:
    """The SSE body for the loop's `early` events (already told), then the rest of `events`."""
    return written(_Writer(model), early, events)


class _Writer:
    def __init__(self, model: str) -> None:
        self.model = model
        self.blocks = 0

    def opened(self) -> bytes:
        return event("message_start", {"message": {
            "id": new_id(), "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}}) + event("ping", {})

    def told(self, told: Event) -> bytes:
        kind, value = told
        if kind == "done":
            return b"".join(self._block(value))
        if kind == "failed":
            return error_event(ProviderUnavailable(
                "The model's provider failed during the tool loop"), Dialect.ANTHROPIC)
        if kind == "answer":
            answer, _ = value
            return event("message_delta", {
                "delta": {"stop_reason": answer.get("stop_reason"),
                          "stop_sequence": answer.get("stop_sequence")},
                "usage": answer.get("usage") or {"output_tokens": 0}}) \
                + event("message_stop", {})
        return b""

    def failed(self, exc: Exception) -> bytes:
        failure = exc if isinstance(exc, GatewayError) \
            else ProviderUnavailable(str(exc)[:500] or type(exc).__name__)
        return error_event(failure, Dialect.ANTHROPIC)

    def _block(self, block: dict[str, Any]) -> Iterator[bytes]:
        """One whole block as its events: opened empty, its content as one delta, closed."""
        index, self.blocks = self.blocks, self.blocks + 1
        kind = block.get("type")
        if kind == "text":
            yield event("content_block_start", {"index": index, "content_block": {
                **block, "text": ""}})
            yield event("content_block_delta", {"index": index, "delta": {
                "type": "text_delta", "text": block.get("text") or ""}})
        elif kind == "thinking":
            yield event("content_block_start", {"index": index, "content_block": {
                **block, "thinking": "", "signature": ""}})
            yield event("content_block_delta", {"index": index, "delta": {
                "type": "thinking_delta", "thinking": block.get("thinking") or ""}})
            if block.get("signature"):
                yield event("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": block["signature"]}})
        elif kind in TOOL_INPUT:
            yield event("content_block_start", {"index": index, "content_block": {
                **block, "input": {}}})
            yield event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta",
                "partial_json": msgspec.json.encode(block.get("input") or {}).decode()}})
        else:  # a tool's result, and what else comes whole
            yield event("content_block_start", {"index": index, "content_block": block})
        yield event("content_block_stop", {"index": index})
