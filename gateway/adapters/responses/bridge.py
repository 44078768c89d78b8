"""A chat-only provider made to serve /v1/responses; its errors pass through unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from gateway.adapters.responses import reply
from gateway.adapters.responses.events import ResponseEvents
from gateway.adapters.responses.request import to_chat
from gateway.adapters.responses.store import ResponseStore, StoredTurn
from gateway.adapters.seam import RESUMED
from gateway.core.errors import ResponseNotFound
from providers.contract.errors import ProviderError, ProviderUnavailable
from providers.contract.provider import Adapter, Outgoing, Provider, Reply
from providers.contract.stream import close_quietly
from providers.wire import sse


class ResponsesBridge(Adapter):
    """Wraps `inner`: Responses requests go out as chat completions and come back translated."""

    kind = "responses-bridge"
    endpoints = frozenset({"responses"})

    def __init__(self, inner: Provider, store: ResponseStore) -> None:
        super().__init__(inner)
        self.store = store

    async def _chat(self, request: Outgoing) -> tuple[dict[str, Any], Outgoing]:
        body = request.json()
        history = None
        if previous := body.get("previous_response_id"):
            # Not this key's, or deleted since admission: the turn must not go on without
            # its history, nor with another key's.
            history = await self.store.get(previous, request.key_id)
            if history is None:
                raise ResponseNotFound(previous)
        return body, request.with_body("chat/completions", to_chat(body, history))

    def _turn(self, request: Outgoing, body: dict[str, Any],
              response: dict[str, Any]) -> bytes | None:
        """This response's turn encoded for the store, or None when it is not to be stored:
        the client said `store: false`, or it is too large (then the answer says so)."""
        if not body.get("store", True) or response.get("store") is False:
            return None
        turn = StoredTurn(reply.output_as_messages(response["output"]),
                          body.get("previous_response_id"), body.get("input"),
                          msgspec.Raw(msgspec.json.encode(response)), request.key_id)
        encoded = self.store.encode(turn)
        if encoded is None:
            response["store"] = False
        return encoded

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        body, chat = await self._chat(request)
        answer = await self.inner.send(chat, upstream_model)
        response = reply.to_response(msgspec.json.decode(answer.body), body,
                                     reply.new_id("resp"))
        if (turn := self._turn(request, body, response)) is not None:
            await self.store.put(response["id"], turn)
        return Reply(msgspec.json.encode(response), usage=answer.usage)

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        body, chat = await self._chat(request)
        chunks = self.inner.stream(chat, upstream_model)
        events = ResponseEvents(body, reply.new_id("resp"))
        if body.get("store", True) and self.store.encode(StoredTurn(
                [], body.get("previous_response_id"), body.get("input"))) is None:
            # The input alone is more than a turn may be: response.created says so already.
            events.response["store"] = False
        turns: list[bytes | None] = []  # decided as the stream ends, before its last event
        events.before_end = lambda response: turns.append(self._turn(request, body, response))
        reader = sse.Reader()
        sent = False
        try:
            async for chunk in chunks:
                out = b"".join(_translate(events, event) for event in reader.feed(chunk))
                if out:
                    sent = True
                    yield out
            if events.response["status"] == "in_progress":
                if events.finish_reason is None:
                    raise ProviderUnavailable("stream ended before it finished")
                # A chat stream resumed below (`gateway.adapters.resume`) says so before the end.
                yield (RESUMED if request.resumes.ok else b"") + events.finish()
        except ProviderError as exc:
            if not sent:
                raise  # nothing sent yet: the router may still fail over
            yield events.fail(exc.reason, f"provider '{self.name}' failed mid-stream: "
                                          f"{exc.message}")
            return
        finally:
            await close_quietly(chunks)
        if events.response["status"] != "failed" and turns and turns[0] is not None:
            await self.store.put(events.response["id"], turns[0])


def _translate(events: ResponseEvents, event: sse.Event) -> bytes:
    if event.done:
        return events.finish() if events.response["status"] == "in_progress" else b""
    data = msgspec.json.decode(event.data)
    if "error" in data:
        message = str((data["error"] or {}).get("message", "upstream error"))
        raise ProviderUnavailable(message)
    return events.feed(data)

