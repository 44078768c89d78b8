"""The fastest upstream we can write in Python: a raw asyncio HTTP/1.1 server on uvloop.

POST /v1/chat/completions answers a fixed chat completion, or with `"stream": true` in the body
an SSE stream of `--chunks` events spaced by `--chunk-delay` seconds. With `--stamp` each
chunk's content carries `tok@<time.monotonic() when written>` so a client on this machine can
measure each chunk's one-way latency. With `--logprobs` the stream is the one the assembly part
(bench/assembly.py) needs: `--chunks` events of one token `a` each with its logprobs entry,
`finish_reason` on the last, then a usage event, written at once. Its own cost must be far below
the proxies measured against it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from typing import cast

import uvloop

COMPLETION = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000,
    "model": "bench-upstream-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the bench "
                 "upstream, a fixed answer of about the size a short reply has."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 16, "total_tokens": 25},
}).encode()
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(COMPLETION)).encode() + b"\r\n\r\n" + COMPLETION)
CHUNK = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
         b'"model":"bench-upstream-model","choices":[{"index":0,"delta":{"content":"tok "},'
         b'"logprobs":null,"finish_reason":null}]}\n\n')
LAST = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"bench-upstream-model","choices":[{"index":0,"delta":{},"logprobs":null,'
        b'"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
STAMPED = CHUNK.replace(b'"tok "', b'"tok@%.6f "')
LOGPROB_CHUNK = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk",'
                 b'"created":1700000000,"model":"bench-upstream-model","choices":[{"index":0,'
                 b'"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.1,'
                 b'"bytes":[97],"top_logprobs":[]}]},"finish_reason":%s}]}\n\n')
USAGE = (b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
         b'"model":"bench-upstream-model","choices":[],"usage":{"prompt_tokens":9,'
         b'"completion_tokens":%d,"total_tokens":%d}}\n\ndata: [DONE]\n\n')
STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def logprob_events(chunks: int) -> list[bytes]:
    """The SSE events of `--logprobs`: `chunks` one-token events with logprobs, the last with
    `finish_reason`, then usage and `[DONE]`."""
    events = [LOGPROB_CHUNK % b"null"] * (chunks - 1) + [LOGPROB_CHUNK % b'"stop"']
    return [*events, USAGE % (chunks, chunks + 9)]


@functools.cache
def logprob_body(chunks: int) -> bytes:
    """`--logprobs`' response body: each event an HTTP chunk of its own, built once."""
    return b"".join(chunked(event) for event in logprob_events(chunks)) + b"0\r\n\r\n"


class Upstream(asyncio.Protocol):
    """One keep-alive connection: parse requests just enough to answer them."""

    def __init__(self, chunks: int, delay: float, stamp: bool = False,
                 logprobs: bool = False) -> None:
        self.buffer = b""
        self.stamp = stamp
        self.logprobs = logprobs
        self.chunks = chunks
        self.delay = delay
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:head.find(b"\r\n", at) if head.find(b"\r\n", at) > 0
                              else None]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            if b'"stream": true' in body or b'"stream":true' in body:
                asyncio.get_running_loop().create_task(self.stream())
            elif self.transport is not None:
                self.transport.write(RESPONSE)

    async def stream(self) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(STREAM_HEAD)
        if self.logprobs:
            transport.write(logprob_body(self.chunks))
            return
        for _ in range(self.chunks):
            if transport.is_closing():
                return
            transport.write(chunked(STAMPED % time.monotonic() if self.stamp else CHUNK))
            if self.delay:
                await asyncio.sleep(self.delay)
        transport.write(chunked(LAST) + b"0\r\n\r\n")


async def serve(port: int, chunks: int, delay: float, stamp: bool = False,
                logprobs: bool = False) -> None:
    loop = asyncio.get_running_loop()
    if logprobs:
        logprob_body(chunks)  # built before the first request, not during it
    server = await loop.create_server(lambda: Upstream(chunks, delay, stamp, logprobs),
                                      "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--stamp", action="store_true")
    parser.add_argument("--logprobs", action="store_true",
                        help="one-token events with logprobs, then usage, written at once")
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.chunks, args.chunk_delay, args.stamp, args.logprobs))


if __name__ == "__main__":
    main()
