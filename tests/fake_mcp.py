"""A real streamable-HTTP MCP server for the tests, written with the official SDK's server side
(`MCPServer`), on a free port in a thread of its own.

Its tools: `echo`, `progress` (reports each step before answering), `wait_until_cancelled`
(answers only when cancelled, and says so in `cancelled`), `big` (a result of n bytes); a prompt
`brief`, a resource `notes://today` and a template `notes://day/{day}`, each naming the server. It
records what `echo` was given (`echoed`), the headers of every HTTP request it gets
(`headers_seen`) and the JSON-RPC method and headers of every POST (`posted`). With `token_url`,
it is its own OAuth server too: `/token` trades client credentials for a token, and `/mcp`
refuses (401) any other bearer, so a test can revoke the current one (`revoke`) or refuse the
next tool call once (`refuse_next_call`). `json_response` answers every request as one JSON
body (no SSE); `legacy` makes it a 2025-11-25 server (`server/discover` is a 404, so clients
`initialize` and carry a session id).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.gateway_process import free_port

CLIENT_ID, CLIENT_SECRET = "gateway-client", "oauth-client-secret-5678"


class FakeMcp:
    """`with FakeMcp() as fake:` serves at `fake.url` (its `/mcp`) until the block ends."""

    def __init__(self, name: str = "fake", oauth: bool = False, json_response: bool = False,
                 legacy: bool = False) -> None:
        self.name = name
        self.oauth = oauth
        self.json_response = json_response
        self.legacy = legacy
        self.posted: list[tuple[str | None, dict[str, str]]] = []
        self._refuse_next = False
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.token_url = f"http://127.0.0.1:{self.port}/token"
        self.headers_seen: list[dict[str, str]] = []
        self.cancelled = threading.Event()
        self.started_waiting = threading.Event()
        self.calls: list[str] = []
        self.echoed: list[str] = []  # every `text` the echo tool was given
        self.tokens_issued = 0
        self._token: str | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def revoke(self) -> None:
        """The current token is refused from now on (the gateway must trade for another)."""
        self._token = None

    def refuse_next_call(self) -> None:
        """The next `tools/call` is answered 401, whatever its token."""
        self._refuse_next = True

    def calls_posted(self) -> list[dict[str, str]]:
        """The headers of every `tools/call` POST."""
        return [headers for method, headers in self.posted if method == "tools/call"]

    def _mcp(self) -> MCPServer:
        server = MCPServer(self.name)
        calls = self.calls

        @server.tool()
        def echo(text: str) -> str:
            """Say `text` back."""
            calls.append("echo")
            self.echoed.append(text)
            return f"echo: {text}"

        @server.tool()
        async def progress(steps: int, ctx: Context) -> str:
            """Count to `steps`, telling each step."""
            calls.append("progress")
            for step in range(1, steps + 1):
                await ctx.report_progress(step, steps, f"step {step}")
                await asyncio.sleep(0.05)  # the fake's pace: each step its own event
            return f"counted to {steps}"

        @server.tool()
        async def wait_until_cancelled() -> str:
            """Never answers on its own."""
            calls.append("wait_until_cancelled")
            self.started_waiting.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
            return "unreachable"

        @server.tool()
        def big(size: int) -> str:
            """A text of `size` bytes."""
            return "x" * size

        self._catalogue(server)

        @server.custom_route("/token", methods=["POST"])
        async def token(request: Request) -> Response:
            form = await request.form()
            if request.headers.get("authorization", "") == "" or \
                    form.get("grant_type") != "client_credentials":
                return JSONResponse({"error": "invalid_request"}, status_code=400)
            import base64
            sent = base64.b64decode(request.headers["authorization"].split()[1]).decode()
            if sent != f"{CLIENT_ID}:{CLIENT_SECRET}":
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            self._token = f"upstream-token-{secrets.token_hex(8)}"
            self.tokens_issued += 1
            return JSONResponse({"access_token": self._token, "token_type": "bearer",
                                 "expires_in": 3600})

        return server

    def _catalogue(self, server: MCPServer) -> None:
        """Its prompt and resources, each naming the server."""

        @server.prompt()
        def brief(topic: str) -> str:
            """A prompt asking for a brief on `topic`."""
            return f"Write a brief on {topic} for {self.name}."

        @server.resource("notes://today", name="today", mime_type="text/plain")
        def today() -> str:
            """Today's notes."""
            return f"{self.name}: nothing planned"

        @server.resource("notes://day/{day}", name="day", mime_type="text/plain")
        def day(day: str) -> str:
            """One day's notes."""
            return f"{self.name}: notes of {day}"

    def _app(self) -> Any:
        inner = self._mcp().streamable_http_app(json_response=self.json_response)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith("/mcp"):
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                self.headers_seen.append(headers)
                method = None
                if scope["method"] == "POST":
                    method, receive = await self._read_method(receive)
                    self.posted.append((method, headers))
                refused = method == "tools/call" and self._refuse_next
                if refused or (self.oauth and
                               headers.get("authorization") != f"Bearer {self._token}"):
                    self._refuse_next = False
                    await JSONResponse({"error": "invalid_token"}, status_code=401)(
                        scope, receive, send)
                    return
                if self.legacy and method == "server/discover":
                    await Response(status_code=404)(scope, receive, send)
                    return
            await inner(scope, receive, send)

        return app

    @staticmethod
    async def _read_method(receive: Any) -> tuple[str | None, Any]:
        """The POST's JSON-RPC method, and a `receive` that gives its body again."""
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        given = False

        async def again() -> Any:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return method, again

    def start(self) -> FakeMcp:
        self._server = uvicorn.Server(uvicorn.Config(
            self._app(), host="127.0.0.1", port=self.port, log_level="warning",
            lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                return self
            threading.Event().wait(0.01)
        raise RuntimeError("the fake MCP server did not start")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeMcp:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
