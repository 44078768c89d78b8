"""One HTTP request to `/mcp` or `/mcp/{server}` (`gateway.edge.mcp_route` says how the MCP
paths are served), imported at the first one: a gateway that serves no MCP never loads the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
from litestar.types import Receive, Scope, Send
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    InboundLadderRejection,
    classify_inbound_request,
    unsupported_protocol_version_rejection,
)
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from gateway.accounts import auth
from gateway.core.call import ClientDisconnected
from gateway.edge.disconnect import DisconnectGuard
from gateway.edge.front import RawRequest
from gateway.edge.mcp_route import PREFIX, WELL_KNOWN, base_url, reply
from gateway.mcp import protocol
from gateway.mcp.cancels import Cancels
from gateway.mcp.hub import Hub
from gateway.mcp.sessions import Session, Sessions, SessionsUnavailable
from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError

SESSION = "mcp-session-id"
VERSION = "mcp-protocol-version"
KEEP_ALIVE = 15.0  # seconds a committed SSE answer may stay silent
SSE_HEAD = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]


async def serve(scope: Scope, receive: Receive, send: Send, runtime: Runtime, hub: Hub,
                sessions: Sessions, cancels: Cancels, path: str) -> None:
    """Answer one request to the MCP path `path`, its refusals included."""
    try:
        await Exchange(scope, receive, send, runtime, hub, sessions, cancels).serve(path)
    except GatewayError as exc:  # refused: the key, its limits, its body
        await _refused(send, scope, exc, path, runtime)
    except SessionsUnavailable:
        await reply(send, 503, protocol.error(None, INTERNAL_ERROR,
                                              "MCP sessions are unavailable (Redis)"))


class Exchange:
    """One HTTP request to an MCP path."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, runtime: Runtime, hub: Hub,
                 sessions: Sessions, cancels: Cancels) -> None:
        self.scope, self.receive, self.send = scope, receive, send
        self.runtime, self.hub, self.sessions = runtime, hub, sessions
        self.cancels = cancels
        self.request = RawRequest(scope, receive, runtime.live.snapshot.server.max_body_bytes)
        self.headers = self.request.headers

    async def serve(self, path: str) -> None:
        snapshot = self.runtime.live.snapshot
        identity = await auth.admitted(self.headers, snapshot, self.runtime.accounts)
        server = path[len(PREFIX) + 1:] or None if path != PREFIX else None
        if server is not None and server not in {s.name for s in snapshot.mcp_servers}:
            await reply(self.send, 404, protocol.error(None, INVALID_REQUEST,
                                                        f"No MCP server '{server[:64]}'"))
            return
        method = self.scope.get("method")
        if method == "DELETE":
            await self._end(identity)
        elif method != "POST":
            await reply(self.send, 405, protocol.error(None, INVALID_REQUEST,
                                                        "Use POST (and DELETE to end a "
                                                        "session)"), {"allow": "POST, DELETE"})
        else:
            await self._post(identity, server)

    async def _end(self, identity: Any) -> None:
        session = await self._session(identity)
        if session is None:
            return
        await self.sessions.end(session.id)
        await reply(self.send, 200, None)

    async def _session(self, identity: Any) -> Session | None:
        """The request's live session, or None once its 400 or 404 is sent."""
        sent = self.headers.get(SESSION)
        if not sent:
            await reply(self.send, 400, protocol.error(
                None, INVALID_REQUEST, "Mcp-Session-Id is required: initialize first, or send "
                "MCP-Protocol-Version: 2026-07-28"))
            return None
        session = await self.sessions.find(sent)
        if session is None or session.key_id != _key_id(identity):  # another key's is unknown
            await reply(self.send, 404, protocol.error(None, INVALID_REQUEST,
                                                        "Session not found: initialize again"))
            return None
        return session

    async def _post(self, identity: Any, server: str | None) -> None:
        body = await self.request.body()
        try:
            message = msgspec.json.decode(body)
        except msgspec.DecodeError:
            await reply(self.send, 400, protocol.error(None, PARSE_ERROR, "Parse error"))
            return
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            await reply(self.send, 400, protocol.error(
                None, INVALID_REQUEST, "The body must be one JSON-RPC request or notification"))
            return
        version = self.headers.get(VERSION, "")
        if version in MODERN_PROTOCOL_VERSIONS:
            await self._modern(identity, server, message, version)
            return
        if version and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            rejected = unsupported_protocol_version_rejection(version)
            assert rejected is not None
            await self._rejected(rejected, message.get("id"))
            return
        if message["method"] == "initialize":
            await self._initialize(identity, message)
            return
        session = await self._session(identity)
        if session is None:
            return
        await self._answer(protocol.Asking(identity, server, session.version), message,
                           session)

    async def _modern(self, identity: Any, server: str | None, message: dict[str, Any],
                      version: str) -> None:
        if "id" not in message:  # no notification means anything at this revision
            await reply(self.send, 202, None)
            return
        verdict = classify_inbound_request(message, headers=self.headers)
        if isinstance(verdict, InboundLadderRejection):
            await self._rejected(verdict, message.get("id"))
            return
        await self._answer(protocol.Asking(identity, server, version), message)

    async def _rejected(self, rejected: InboundLadderRejection, request_id: Any) -> None:
        await reply(self.send, ERROR_CODE_HTTP_STATUS.get(rejected.code, 400),
                     protocol.error(request_id, rejected.code, rejected.message, rejected.data))

    async def _initialize(self, identity: Any, message: dict[str, Any]) -> None:
        params = message.get("params")
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        version = protocol.agreed(asked)
        session = await self.sessions.open(_key_id(identity), version)
        await reply(self.send, 200, {"jsonrpc": "2.0", "id": message.get("id"),
                                      "result": protocol.initialized(version)},
                     {SESSION: session.id})

    async def _answer(self, asking: protocol.Asking, message: dict[str, Any],
                      session: Session | None = None) -> None:
        if "id" not in message:  # a notification: only a cancellation means something here
            params = message.get("params")
            if session is not None and message["method"] == "notifications/cancelled" \
                    and isinstance(params, dict) and "requestId" in params:
                await self.cancels.cancel(session.id, params["requestId"])
            await reply(self.send, 202, None)
            return
        streamed = message["method"] == "tools/call" \
            and "text/event-stream" in self.headers.get("accept", "")
        progress = streamed and _progress_asked(message)  # only then can the call tell any
        if session is None and not progress:
            await self._answer_here(asking, message, streamed)
            return
        events: asyncio.Queue[dict[str, Any]] | None = None
        if progress:
            told: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=256)
            events = told

            async def notify(notification: dict[str, Any]) -> None:
                with contextlib.suppress(asyncio.QueueFull):  # a client that does not read
                    told.put_nowait(notification)

            asking = protocol.Asking(asking.identity, asking.server, asking.version, notify)
        if session is not None:
            await self.cancels.ready()
        with self.runtime.serving(self.headers, "mcp"):
            call = asyncio.ensure_future(protocol.answer(self.hub, asking, message))
            with self.cancels.running_as(session.id if session is not None else None,
                                         message["id"], call):
                try:
                    async with DisconnectGuard(self.receive):
                        committed = await self._relay(call, events, streamed)
                except (ClientDisconnected, OSError):
                    return
                finally:
                    call.cancel()  # the client left: the upstream hears it at once
        await self._answered(asking, self._result(call, message.get("id"), committed),
                             committed)

    async def _answer_here(self, asking: protocol.Asking, message: dict[str, Any],
                           streamed: bool) -> None:
        """A request that nothing else needs a handle on (no session to cancel it through, no
        progress to relay) answered in this task: no task of its own, no waits on it. A
        streamed answer is kept alive meanwhile (`KeepAlive`)."""
        alive = KeepAlive(self.send) if streamed else None
        try:
            with self.runtime.serving(self.headers, "mcp"):
                async with DisconnectGuard(self.receive):  # the upstream hears a leaving client
                    answered = await protocol.answer(self.hub, asking, message)
        except ClientDisconnected:
            return
        except GatewayError as exc:  # a refusal: its own status, or said in-band once committed
            if alive is None or not alive.committed:
                raise
            answered = protocol.error(message["id"], protocol.REFUSED, exc.message)
        finally:
            if alive is not None:
                await alive.stop()
        if alive is not None and alive.gone:
            return
        await self._answered(asking, answered, alive is not None and alive.committed)

    async def _answered(self, asking: protocol.Asking, answered: dict[str, Any],
                        committed: bool) -> None:
        """The JSON-RPC answer sent: the last event of a committed stream, else JSON."""
        if committed:
            await self._event(answered, more=False)
            return
        status = 200
        if asking.modern and "error" in answered:  # the modern revision's status table
            status = ERROR_CODE_HTTP_STATUS.get(answered["error"]["code"], 200)
        await reply(self.send, status, answered, redact=self.runtime)

    async def _relay(self, call: asyncio.Future[Any],
                     events: asyncio.Queue[dict[str, Any]] | None, streamed: bool) -> bool:
        """Until `call` is done: its notifications (when it may have any: `events`) sent as SSE
        events as they come, the head committed at the first one (or at a keep-alive); whether
        it was committed. A call that ends first is answered as JSON, with its real status."""
        if not streamed:
            await asyncio.wait((call,))
            return False
        committed = False
        while not call.done():
            waiting = asyncio.ensure_future(events.get()) if events is not None else None
            await asyncio.wait((call,) if waiting is None else (call, waiting),
                               timeout=KEEP_ALIVE, return_when=asyncio.FIRST_COMPLETED)
            heard = waiting is not None and waiting.done()
            if waiting is not None and not heard:
                waiting.cancel()
            if call.done() and not heard:
                continue
            if not committed:
                await self.send({"type": "http.response.start", "status": 200,
                                 "headers": SSE_HEAD})
                committed = True
            if waiting is not None and heard:
                await self._event(waiting.result(), more=True)
            else:  # quiet for a while: a comment keeps proxies from closing the stream
                await self.send({"type": "http.response.body", "body": b": ping\n\n",
                                 "more_body": True})
        while committed and events is not None and not events.empty():
            await self._event(events.get_nowait(), more=True)
        return committed

    @staticmethod
    def _result(call: asyncio.Future[dict[str, Any]], request_id: Any, committed: bool
                ) -> dict[str, Any]:
        """The call's JSON-RPC answer; a cancellation the client asked for said in it, and a
        refusal (429) too once the head was sent (else raised, for its own status)."""
        if call.cancelled():
            return protocol.error(request_id, INTERNAL_ERROR, "The call was cancelled")
        if isinstance(exc := call.exception(), GatewayError) and committed:
            return protocol.error(request_id, protocol.REFUSED, exc.message)
        return call.result()

    async def _event(self, payload: dict[str, Any], more: bool) -> None:
        data = self.runtime.live.redactor.encoded(msgspec.json.encode(payload))
        await self.send({"type": "http.response.body",
                         "body": b"event: message\ndata: " + data + b"\n\n", "more_body": more})


class KeepAlive:
    """A streamed answer's keep-alive while its call runs in the request's task: past
    `KEEP_ALIVE` seconds the SSE head is committed and a comment sent every `KEEP_ALIVE`
    seconds, by a task started only then (most calls end long before)."""

    __slots__ = ("_send", "_stopped", "_task", "_timer", "_waking", "committed", "gone")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.committed = False  # the head is sent (or being sent)
        self.gone = False  # a send failed: the client left
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self._waking: asyncio.Event | None = None
        self._timer = asyncio.get_running_loop().call_later(KEEP_ALIVE, self._start)

    def _start(self) -> None:
        self._waking = asyncio.Event()
        self._task = asyncio.create_task(self._ping(self._waking))

    async def _ping(self, waking: asyncio.Event) -> None:
        try:
            while not self._stopped:
                if not self.committed:
                    self.committed = True
                    await self._send({"type": "http.response.start", "status": 200,
                                      "headers": SSE_HEAD})
                await self._send({"type": "http.response.body", "body": b": ping\n\n",
                                  "more_body": True})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waking.wait(), KEEP_ALIVE)
        except OSError:
            self.gone = True

    async def stop(self) -> None:
        """No more comments: back once the one being sent (if any) is."""
        self._stopped = True
        self._timer.cancel()
        if self._task is not None and self._waking is not None:
            self._waking.set()
            await self._task


def _progress_asked(message: dict[str, Any]) -> bool:
    """Whether the request carries a `progressToken` (its progress is relayed as SSE events)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None


def _key_id(identity: Any) -> str | None:
    return identity.limits.key_id if identity is not None else None


async def _refused(send: Send, scope: Scope, exc: GatewayError, path: str,
                   runtime: Runtime) -> None:
    headers = dict(exc.headers())
    if exc.status == 401:
        headers["www-authenticate"] = \
            f'Bearer resource_metadata="{base_url(scope)}{WELL_KNOWN}{path}"'
    code = protocol.REFUSED if exc.status == 429 else INVALID_REQUEST
    await reply(send, exc.status, protocol.error(None, code, exc.message), headers,
                 redact=runtime)
