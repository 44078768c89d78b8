"""The gateway's MCP tool loop as a Responses stream: each item's events sent as the loop makes
it (an `mcp_list_tools` once listed, an `mcp_call` as it starts and as it ends), the model's
final output after, then `response.completed` (pure but for the loop it reads)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from typing import Any

import msgspec

from gateway.adapters.mcp_loop import Event, written
from gateway.adapters.responses import reply


def streamed(request: dict[str, Any], early: list[Event],
             events: AsyncGenerator[Event, None]) -> AsyncGenerator[bytes, None]:
    """The SSE body for the loop's `early` events (already told), then the rest of `events`."""
    return written(_Writer(reply.skeleton(request, reply.new_id("resp"), "in_progress")),
                   early, events)


class _Writer:
    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response
        self.sequence = 0
        self.index: dict[str, int] = {}  # item id → its output index

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"

    def opened(self) -> bytes:
        snapshot = {**self.response, "output": []}
        return (self._event("response.created", response=snapshot)
                + self._event("response.in_progress", response=snapshot))

    def told(self, event: Event) -> bytes:
        kind, value = event
        if kind == "added":
            return self._added(value)
        if kind == "done":
            return self._finished(value)
        if kind == "failed":
            return self._failed("The model's provider failed during the tool loop")
        if kind == "answer":
            answer, _ = value
            final = {**answer, "id": self.response["id"], "output": self.response["output"]}
            return self._event(f"response.{_ended(final)}", response=final)
        return b""

    def failed(self, exc: Exception) -> bytes:
        return self._failed(str(exc)[:500] or type(exc).__name__)

    def _failed(self, message: str) -> bytes:
        self.response["status"] = "failed"
        self.response["error"] = {"code": "server_error", "message": message}
        return (self._event("error", code="server_error", message=message, param=None)
                + self._event("response.failed", response=self.response))

    def _added(self, item: dict[str, Any]) -> bytes:
        index = self.index[item["id"]] = len(self.index)
        out = self._event("response.output_item.added", output_index=index, item=item)
        if item["type"] == "mcp_call":
            out += self._event("response.mcp_call.in_progress", item_id=item["id"],
                               output_index=index)
            out += self._event("response.mcp_call_arguments.done", item_id=item["id"],
                               output_index=index, arguments=item["arguments"])
        return out

    def _finished(self, item: dict[str, Any]) -> bytes:
        out = b""
        if item.get("id") not in self.index:
            out += b"".join(self._opening(item))
        index = self.index[item["id"]]
        kind = item.get("type")
        if kind == "mcp_list_tools":
            out += self._event("response.mcp_list_tools.completed", item_id=item["id"],
                               output_index=index)
        elif kind == "mcp_call":
            ended = "completed" if item["status"] == "completed" else "failed"
            out += self._event(f"response.mcp_call.{ended}", item_id=item["id"],
                               output_index=index)
        elif kind == "message":
            out += b"".join(self._text(item, index))
        self.response["output"].append(item)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _opening(self, item: dict[str, Any]) -> Iterable[bytes]:
        """The events that open an item the loop tells whole (listed, or the model's)."""
        index = self.index[item["id"]] = len(self.index)
        if item.get("type") == "mcp_list_tools":
            yield self._event("response.output_item.added", output_index=index,
                              item={**item, "tools": []})
            yield self._event("response.mcp_list_tools.in_progress", item_id=item["id"],
                              output_index=index)
        elif item.get("type") == "message":
            yield self._event("response.output_item.added", output_index=index,
                              item={**item, "status": "in_progress", "content": []})
        else:
            yield self._event("response.output_item.added", output_index=index, item=item)

    def _text(self, item: dict[str, Any], index: int) -> Iterable[bytes]:
        for number, part in enumerate(item.get("content") or ()):
            if part.get("type") != "output_text":
                continue
            empty = {**part, "text": ""}
            yield self._event("response.content_part.added", item_id=item["id"],
                              output_index=index, content_index=number, part=empty)
            yield self._event("response.output_text.delta", item_id=item["id"],
                              output_index=index, content_index=number, delta=part["text"],
                              logprobs=[])
            yield self._event("response.output_text.done", item_id=item["id"],
                              output_index=index, content_index=number, text=part["text"],
                              logprobs=[])
            yield self._event("response.content_part.done", item_id=item["id"],
                              output_index=index, content_index=number, part=part)


def _ended(response: dict[str, Any]) -> str:
    return {"incomplete": "incomplete", "failed": "failed"}.get(response.get("status", ""),
                                                                "completed")
