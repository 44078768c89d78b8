"""Chat-completion chunks in, the Responses API event sequence out (pure, stateful).

    response.created, response.in_progress
    per output item, in the order the model produced them:
      reasoning:     output_item.added, reasoning_text.delta…, reasoning_text.done, output_item.done
      message:       output_item.added, content_part.added, output_text.delta…,
                     output_text.done, content_part.done, output_item.done
      function_call: output_item.added, function_call_arguments.delta…,
                     function_call_arguments.done, output_item.done
    response.completed (or response.incomplete when cut by length; response.failed on error)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from gateway.adapters.responses import reply


class _Item:
    """One output item being streamed."""

    def __init__(self, kind: str, index: int, item_id: str, call_id: str = "",
                 name: str = "") -> None:
        self.kind, self.index, self.id = kind, index, item_id
        self.call_id, self.name = call_id, name
        self.text = ""


class ResponseEvents:
    """Feed parsed chat chunks; get Responses SSE bytes; `finish()` or `fail()` at the end."""

    def __init__(self, request: dict[str, Any], response_id: str) -> None:
        self.response = reply.skeleton(request, response_id, "in_progress")
        self.started = False
        self.sequence = 0
        self.items: list[_Item] = []
        self.open: _Item | None = None
        self.calls: dict[int, _Item] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        # Hears the finished response just before response.completed carries it (the store
        # decides there whether it can keep it, and the answer says so).
        self.before_end: Callable[[dict[str, Any]], None] | None = None

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        snapshot = {**self.response, "output": []}
        return (self._event("response.created", response=snapshot)
                + self._event("response.in_progress", response=snapshot))

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Events for one chat chunk (the first also opens the response)."""
        out = self._start()
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # a Response has one output; extra chat choices are dropped
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                out += self._text("reasoning", reasoning)
            if delta.get("content"):
                out += self._text("message", delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def finish(self) -> bytes:
        """Close every item and end with response.completed (or .incomplete)."""
        out = self._start() + self._close_open()
        out += b"".join(self._close_call(call) for call in self.calls.values())
        self.calls = {}
        reply.finish(self.response, self.finish_reason)
        if (counted := reply.usage(self.usage)) is not None:
            self.response["usage"] = counted
        if self.before_end is not None:
            self.before_end(self.response)
        kind = "response.completed" if self.response["status"] == "completed" \
            else "response.incomplete"
        return out + self._event(kind, response=self.response)

    def fail(self, code: str, message: str) -> bytes:
        """End a broken stream: an error event and response.failed, never a silent cut."""
        self.response["status"] = "failed"
        self.response["error"] = {"code": "server_error", "message": message}
        return (self._event("error", code=code, message=message, param=None)
                + self._event("response.failed", response=self.response))

    def _text(self, kind: str, text: str) -> bytes:
        out = b""
        if self.open is None or self.open.kind != kind:
            out += self._close_open()
            prefix = "rs" if kind == "reasoning" else "msg"
            self.open = self._add(_Item(kind, len(self.items), reply.new_id(prefix)))
            added = (reply.reasoning_item("", self.open.id) if kind == "reasoning"
                     else reply.message_item("", self.open.id))
            added["status"] = "in_progress"
            added["content"] = []
            out += self._event("response.output_item.added", output_index=self.open.index,
                               item=added)
            if kind == "message":
                out += self._event("response.content_part.added", item_id=self.open.id,
                                   output_index=self.open.index, content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": [],
                                         "logprobs": []})
        item = self.open
        item.text += text
        if kind == "reasoning":
            return out + self._event("response.reasoning_text.delta", item_id=item.id,
                                     output_index=item.index, content_index=0, delta=text)
        return out + self._event("response.output_text.delta", item_id=item.id,
                                 output_index=item.index, content_index=0, delta=text,
                                 logprobs=[])

    def _close_open(self) -> bytes:
        item, self.open = self.open, None
        if item is None:
            return b""
        if item.kind == "reasoning":
            done = reply.reasoning_item(item.text, item.id)
            return (self._event("response.reasoning_text.done", item_id=item.id,
                                output_index=item.index, content_index=0, text=item.text)
                    + self._done(item, done))
        done = reply.message_item(item.text, item.id)
        return (self._event("response.output_text.done", item_id=item.id,
                            output_index=item.index, content_index=0, text=item.text,
                            logprobs=[])
                + self._event("response.content_part.done", item_id=item.id,
                              output_index=item.index, content_index=0,
                              part=done["content"][0])
                + self._done(item, done))

    def _call(self, call: dict[str, Any]) -> bytes:
        out = b""
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self.calls.get(index)
        if item is None:
            out += self._close_open()
            item = self.calls[index] = self._add(_Item(
                "function_call", len(self.items), reply.new_id("fc"),
                call.get("id") or reply.new_id("call"), function.get("name", "")))
            added = reply.call_item(item.call_id, item.name, "", item.id)
            added["status"] = "in_progress"
            out += self._event("response.output_item.added", output_index=item.index,
                               item=added)
        if arguments := function.get("arguments"):
            item.text += arguments
            out += self._event("response.function_call_arguments.delta", item_id=item.id,
                               output_index=item.index, delta=arguments)
        return out

    def _close_call(self, item: _Item) -> bytes:
        done = reply.call_item(item.call_id, item.name, item.text, item.id)
        return (self._event("response.function_call_arguments.done", item_id=item.id,
                            output_index=item.index, name=item.name, arguments=item.text)
                + self._done(item, done))

    def _add(self, item: _Item) -> _Item:
        self.items.append(item)
        return item

    def _done(self, item: _Item, final: dict[str, Any]) -> bytes:
        self.response["output"].append(final)
        return self._event("response.output_item.done", output_index=item.index, item=final)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n"
