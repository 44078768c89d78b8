"""`llms-gateway chat`: one prompt, or a conversation read line by line from stdin, each
answer streamed as it comes through a running gateway."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import msgspec

from providers.contract.errors import GatewayError
from providers.contract.transport import HttpResponse, Link, ProxyEnvironment
from providers.transport import AiohttpTransport
from providers.wire import sse

EXIT = "/exit"


@dataclass(slots=True)
class Conversation:
    """What each request sends: the model, the sampling options, the messages so far."""

    model: str
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def body(self, prompt: str) -> bytes:
        """The streamed request for `prompt`, after the conversation so far."""
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages += [*self.messages, {"role": "user", "content": prompt}]
        body: dict[str, Any] = {"model": self.model, "stream": True, "messages": messages}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return msgspec.json.encode(body)

    def answered(self, prompt: str, answer: str) -> None:
        """Keep an exchange that went through, so the next prompt follows it."""
        self.messages += [{"role": "user", "content": prompt},
                          {"role": "assistant", "content": answer}]


def run(url: str, key: str | None, conversation: Conversation, prompt: str | None) -> int:
    """Ask `prompt` once, or with none hold a conversation on stdin until EOF or `/exit`."""
    if prompt is not None:
        return asyncio.run(_one(url, key, conversation, prompt))
    return asyncio.run(_session(url, key, conversation, sys.stdin))


async def _one(url: str, key: str | None, conversation: Conversation, prompt: str) -> int:
    async with AiohttpTransport() as transport:
        status, _ = await _ask(transport, url, key, conversation, prompt)
    return status


async def _session(url: str, key: str | None, conversation: Conversation,
                   lines: TextIO) -> int:
    # The prompt marker goes to stderr, and only for a person at a terminal: piped output
    # stays the answers alone.
    interactive = lines.isatty()
    if interactive:
        print(f"chat with {conversation.model} (EOF or {EXIT} ends)", file=sys.stderr)
    async with AiohttpTransport() as transport:
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = await asyncio.to_thread(lines.readline)  # the loop stays free meanwhile
            if not line or line.strip() == EXIT:
                return 0
            prompt = line.strip()
            if not prompt:
                continue
            status, answer = await _ask(transport, url, key, conversation, prompt)
            if status == 0:
                conversation.answered(prompt, answer)


async def _ask(transport: AiohttpTransport, url: str, key: str | None,
               conversation: Conversation, prompt: str) -> tuple[int, str]:
    """Stream one answer to stdout; the exit status and the answer's text."""
    # Through the same transport as the gateway's own upstream calls: one HTTP client in the
    # project, and HTTPS_PROXY / NO_PROXY honoured as curl would for a remote gateway.
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        response = await transport.request(
            "POST", f"{url}/chat/completions", headers=headers, body=conversation.body(prompt),
            link=link_to(url), compressed=False)
        try:
            if response.status != 200:
                print(error_text(await response.read()), file=sys.stderr)
                return 1, ""
            return await _print_stream(response)
        finally:
            response.close()
    except GatewayError as exc:
        print(f"llms-gateway: cannot reach {url}: {exc.message}", file=sys.stderr)
        return 1, ""


async def _print_stream(response: HttpResponse) -> tuple[int, str]:
    """Write each content delta of an SSE chat stream as it arrives; 1 on an in-band error."""
    reader = sse.Reader()
    said: list[str] = []
    while chunk := await response.readany():
        for event in reader.feed(chunk):
            if (ended := _print_event(event, said)) is not None:
                return ended, "".join(said)
    for event in reader.flush():
        if (ended := _print_event(event, said)) is not None:
            return ended, "".join(said)
    sys.stdout.write("\n")
    return 0, "".join(said)


def _print_event(event: sse.Event, said: list[str]) -> int | None:
    """Write one event's content (kept in `said`); the exit status once the stream is over
    (`[DONE]`, an error)."""
    if event.done:
        sys.stdout.write("\n")
        sys.stdout.flush()
        return 0
    data = msgspec.json.decode(event.data)
    if "error" in data:
        print(f"\nerror: {data['error'].get('message')}", file=sys.stderr)
        return 1
    for choice in data.get("choices") or ():
        piece = (choice.get("delta") or {}).get("content") or ""
        said.append(piece)
        sys.stdout.write(piece)
    sys.stdout.flush()
    return None


def link_to(url: str) -> Link:
    """How the CLI reaches the gateway at `url`: the environment's proxy unless NO_PROXY."""
    return Link(proxy=ProxyEnvironment.read(os.environ).proxy_for(url))


def error_text(body: bytes) -> str:
    """A gateway's error envelope as one line for a terminal."""
    try:
        error = msgspec.json.decode(body)["error"]
        return f"error: {error.get('code')}: {error.get('message')}"
    except (msgspec.DecodeError, KeyError, TypeError):
        return f"error: {body[:500].decode('utf-8', 'replace')}"
