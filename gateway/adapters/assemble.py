"""A whole answer fetched as a stream: early failover for non-streamed requests.

A whole answer gives no sign of life until it is done, so a hung provider could only be given
up after `total`. Sent upstream as a stream instead, the request gets the stream's watchdogs
(`first_token`, `idle`), and since the client has been sent nothing, a break anywhere before
the end is still a failover. The events are assembled (`ChatAssembler`, `CompletionAssembler`,
pure, each event decoded once, every piece kept and joined once at the end) into the very
answer the provider would have given whole: every choice, content, reasoning, refusal, tool
calls, logprobs, `finish_reason`, usage, `system_fingerprint`. The answer is bounded in bytes
(`max_answer_bytes`) and in events (`max_answer_events`). A provider with
`"stream_upstream": false` is asked for the whole answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from gateway.adapters.assembler import Assembler, ChatAssembler, CompletionAssembler
from gateway.core import endpoints
from providers.contract.answer import check_json
from providers.contract.errors import AnsweredWhole, BadUpstreamResponse, ProviderUnavailable
from providers.contract.provider import Adapter, Answer, Gathering, Outgoing, Provider, Reply
from providers.contract.stream import (
    UNREADABLE_ANSWER,
    close_quietly,
    open_stream,
    read_to_end,
    unreadable,
)
from providers.contract.usage import Usage

ENDPOINTS = endpoints.STREAMED_WHOLE
__all__ = ["ENDPOINTS", "Assembled", "ChatAssembler", "CompletionAssembler", "assembles"]


class Assembled(Adapter):
    """A provider whose whole answers are asked for as streams and gathered (`Gathering`)."""

    kind = "assembled"

    async def answer(self, request: Outgoing, upstream_model: str) -> Answer:
        if request.stream or request.endpoint not in ENDPOINTS:
            return await self.inner.answer(request, upstream_model)
        assembler = ChatAssembler(request.choices) if request.endpoint == "chat/completions" \
            else CompletionAssembler(request.choices)
        chunks = self.inner.stream(request.asking(stream=True), upstream_model)
        try:
            head, _ = await open_stream(chunks, watch=assembler)
        except AnsweredWhole as whole:  # the server ignored `stream`: what came is the answer
            return Reply(whole.payload, usage=check_json(whole.payload))
        return _Gathering(self.name, assembler, len(head), chunks, self.spec.max_answer_bytes,
                          self.spec.max_answer_events)


def assembles(provider: Provider, endpoint: str) -> bool:
    """Whether whole answers of `endpoint` from `provider` are gathered from streams."""
    return endpoint in ENDPOINTS and provider.supports(endpoint) \
        and provider.streams_whole_answers()


class _Gathering(Gathering):
    def __init__(self, provider: str, assembler: Assembler, size: int,
                 rest: AsyncIterator[bytes], max_bytes: int, max_events: int) -> None:
        self.provider = provider
        self.assembler = assembler
        self.size = size
        self.rest = rest
        self.max_bytes = max_bytes
        self.max_events = max_events

    async def reply(self) -> Reply:
        try:
            return await self._read()
        except UNREADABLE_ANSWER as exc:
            raise unreadable(self.provider, exc) from None
        finally:
            await close_quietly(self.rest)

    async def _read(self) -> Reply:
        assembler = self.assembler
        if not assembler.done:
            size, max_bytes, max_events = self.size, self.max_bytes, self.max_events
            async for chunk in self.rest:
                size += len(chunk)
                if size > max_bytes:  # held in memory until whole: bounded
                    raise BadUpstreamResponse(f"answer is larger than max_answer_bytes "
                                              f"({max_bytes})")
                if assembler.take(chunk) or assembler.data_events > max_events:
                    if assembler.broken:
                        raise ProviderUnavailable("stream broke before it finished")
                    if assembler.data_events > max_events:
                        raise BadUpstreamResponse(f"answer has more events than "
                                                  f"max_answer_events ({max_events})")
                    break  # done
            else:
                assembler.flush()
            self.size = size
        if assembler.done:  # read the body's end, so its connection is kept for the next request
            await read_to_end(self.rest)
        if assembler.broken or not (assembler.done or assembler.finished) \
                or not assembler.choices:
            raise ProviderUnavailable("stream ended before it finished")
        answer = assembler.answer()
        usage = msgspec.convert(answer["usage"], Usage) if answer.get("usage") else None
        return Reply(msgspec.json.encode(answer), usage=usage)

    async def close(self) -> None:
        await close_quietly(self.rest)
