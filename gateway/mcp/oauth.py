"""The gateway's own OAuth token for an upstream MCP server: client credentials (RFC 6749
§4.4) traded at the configured `token_url`, kept until shortly before it expires, and traded
again when the upstream answers 401. The client's own token never goes upstream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

import httpx2

from gateway.core.settings.mcp import McpOAuth

EARLY = 30.0  # seconds before its expiry a token is replaced
DEFAULT_LIFE = 300.0  # a token whose answer gives no `expires_in`
MAX_TOKEN_ANSWER = 64 * 1024


class TokenRefused(Exception):
    """The token endpoint did not give a token."""


class ClientCredentials(httpx2.Auth):
    """`Authorization: Bearer <the gateway's token>` on each upstream request."""

    def __init__(self, oauth: McpOAuth, timeout: float = 10.0) -> None:
        self.oauth = oauth
        self.timeout = timeout
        self._token: str | None = None
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def async_auth_flow(self, request: httpx2.Request
                              ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        token = await self.token()
        request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:  # revoked or expired early: one new token, one retry
            token = await self.token(stale=token)
            request.headers["Authorization"] = f"Bearer {token}"
            yield request

    async def token(self, stale: str | None = None) -> str:
        """A live token; a new one when there is none, it is about to expire, or it is
        `stale` (the one an upstream just refused)."""
        async with self._lock:
            if self._token is not None and self._token != stale \
                    and time.monotonic() < self._expires - EARLY:
                return self._token
            self._token, life = await self._trade()
            self._expires = time.monotonic() + life
            return self._token

    async def _trade(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials"}
        if self.oauth.scope:
            form["scope"] = self.oauth.scope
        async with httpx2.AsyncClient(timeout=self.timeout) as client:
            answer = await client.post(self.oauth.token_url, data=form,
                                       auth=(self.oauth.client_id, self.oauth.client_secret))
        if answer.status_code != 200 or len(answer.content) > MAX_TOKEN_ANSWER:
            raise TokenRefused(f"the token endpoint answered {answer.status_code}")
        try:
            body = answer.json()
            token = body["access_token"]
        except (ValueError, KeyError, TypeError):
            raise TokenRefused("the token endpoint's answer holds no access_token") from None
        if not isinstance(token, str) or not token:
            raise TokenRefused("the token endpoint's access_token is not a string")
        life = body.get("expires_in")
        return token, float(life) if isinstance(life, (int, float)) and life > 0 \
            else DEFAULT_LIFE
