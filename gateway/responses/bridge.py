"""A chat-only provider made to serve /v1/responses; its errors pass through unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from gateway.responses import reply
from gateway.responses.events import ResponseEvents
from gateway.responses.request import to_chat
from gateway.responses.store import ResponseStore, StoredTurn
from providers.contract.errors import ProviderError, ProviderUnavailable
from providers.contract.provider import Outgoing, Provider, Reply


class ResponsesBridge(Provider):
    """Wraps `inner`: Responses requests go out as chat completions and come back translated."""

    kind = "responses-bridge"
    endpoints = frozenset({"responses"})

    def __init__(self, inner: Provider, store: ResponseStore) -> None:
        super().__init__(inner.spec, inner.transport)
        self.inner = inner
        self.store = store

    async def _chat(self, request: Outgoing) -> tuple[dict[str, Any], Outgoing]:
        body = request.json()
        history = await self.store.get(body["previous_response_id"]) \
            if body.get("previous_response_id") else None
        chat = to_chat(body, history)
        outgoing = Outgoing("chat/completions", msgspec.json.encode(chat), request.model,
                            request.stream, request.request_id, client_wants_usage=True)
        return body, outgoing

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
        buffer = b""
        sent = False
        try:
            async for chunk in chunks:
                buffer += chunk
                *complete, buffer = buffer.split(b"\n\n")
                out = b"".join(_translate(events, event) for event in complete)
                if out:
                    sent = True
                    yield out
            if events.response["status"] == "in_progress":
                if events.finish_reason is None:
                    raise ProviderUnavailable("stream ended before it finished")
                yield events.finish()
        except ProviderError as exc:
            if not sent:
                raise  # nothing sent yet: the router may still fail over
            yield events.fail(exc.reason, f"provider '{self.name}' failed mid-stream: "
                                          f"{exc.message}")
            return
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        if events.response["status"] != "failed" and turns and turns[0] is not None:
            await self.store.put(events.response["id"], turns[0])


def _translate(events: ResponseEvents, event: bytes) -> bytes:
    line = event.strip()
    if not line.startswith(b"data:"):
        return b""
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return events.finish() if events.response["status"] == "in_progress" else b""
    data = msgspec.json.decode(payload)
    if "error" in data:
        message = str((data["error"] or {}).get("message", "upstream error"))
        raise ProviderUnavailable(message)
    return events.feed(data)

