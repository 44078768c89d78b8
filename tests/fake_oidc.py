"""A fake OpenID Connect issuer on a real socket, signing with its own RSA keys.

Discovery, JWKS, an authorize endpoint that approves at once as whoever the test chose (its
`sub`, `email` and groups), and a token endpoint that checks the code, the client's secret and
the PKCE verifier before it hands out an ID token. Fault modes sign that token wrongly on
purpose: for another audience, already expired, for another nonce, with a key the JWKS does
not publish under a key id it does, or under one made up each time; `rotate`
replaces the signing key (and what the JWKS publishes) as issuers do.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import socket
import threading
import time
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

CLIENT_ID = "llms-console"
CLIENT_SECRET = "console-client-secret-1"
FAULTS = (None, "wrong_aud", "expired", "bad_signature", "wrong_nonce", "unknown_kid")


class FakeIssuer:
    """`http://127.0.0.1:PORT`, serving from a daemon thread with its own event loop."""

    def __init__(self) -> None:
        self.port = 0
        self.fault: str | None = None
        self.claims: dict[str, Any] = {"sub": "u-1", "email": "ada@example.com",
                                       "groups": ["llms-admins"]}
        self._keys = [self._new_key()]
        self._codes: dict[str, dict[str, Any]] = {}
        self.jwks_fetches = 0
        self.tokens_issued = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sign_in_as(self, sub: str, email: str | None, groups: list[str]) -> None:
        """Who the next sign-in approves."""
        self.claims = {"sub": sub, "groups": groups, **({"email": email} if email else {})}

    def rotate(self) -> None:
        """Sign with a new key from now on; the JWKS publishes only the new one."""
        self._keys = [self._new_key()]

    @staticmethod
    def _new_key() -> RSAKey:
        return RSAKey.generate_key(2048, parameters={"kid": secrets.token_hex(6)}, private=True)

    # -- the endpoints -------------------------------------------------------------------------

    async def discovery(self, _: web.Request) -> web.Response:
        return web.json_response({
            "issuer": self.url, "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token", "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"], "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"]})

    async def jwks(self, _: web.Request) -> web.Response:
        self.jwks_fetches += 1
        return web.json_response(KeySet(self._keys).as_dict(private=False))

    async def authorize(self, request: web.Request) -> web.Response:
        query = request.query
        wanted = ("response_type", "client_id", "redirect_uri", "state", "nonce",
                  "code_challenge", "code_challenge_method")
        if any(name not in query for name in wanted) or query["response_type"] != "code" \
                or query["client_id"] != CLIENT_ID or query["code_challenge_method"] != "S256":
            return web.json_response({"error": "invalid_request"}, status=400)
        code = secrets.token_urlsafe(16)
        self._codes[code] = {"nonce": query["nonce"], "challenge": query["code_challenge"],
                             "redirect_uri": query["redirect_uri"], "claims": dict(self.claims)}
        target = f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query['state']})}"
        raise web.HTTPFound(target)

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        grant = self._codes.pop(str(form.get("code", "")), None)
        verifier = str(form.get("code_verifier", ""))
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()
                                             ).rstrip(b"=").decode()
        if grant is None or form.get("grant_type") != "authorization_code" \
                or form.get("redirect_uri") != grant["redirect_uri"] \
                or challenge != grant["challenge"]:
            return web.json_response({"error": "invalid_grant"}, status=400)
        if form.get("client_id") != CLIENT_ID or form.get("client_secret") != CLIENT_SECRET:
            return web.json_response({"error": "invalid_client"}, status=401)
        self.tokens_issued += 1
        return web.json_response({"access_token": secrets.token_urlsafe(16),
                                  "token_type": "Bearer", "expires_in": 300,
                                  "id_token": self.id_token(grant["claims"], grant["nonce"])})

    def id_token(self, claims: dict[str, Any], nonce: str) -> str:
        """An ID token for `claims`, signed as the current fault says."""
        now = int(time.time())
        body = {"iss": self.url, "aud": CLIENT_ID, "iat": now, "exp": now + 300,
                "nonce": nonce, **claims}
        if self.fault == "wrong_aud":
            body["aud"] = "another-client"
        elif self.fault == "expired":
            body["iat"], body["exp"] = now - 7200, now - 3600
        elif self.fault == "wrong_nonce":
            body["nonce"] = "not-the-nonce-sent"
        key = self._keys[0]
        if self.fault == "bad_signature":  # the published key id, another key's signature
            key = RSAKey.generate_key(2048, parameters={"kid": key.kid}, private=True)
        elif self.fault == "unknown_kid":  # a key id made up anew each time, never published
            key = self._new_key()
        return jwt.encode({"alg": "RS256", "kid": key.kid}, body, key)

    # -- the server, in its own thread --------------------------------------------------------

    def start(self) -> FakeIssuer:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve(sock, ready)),
                                        daemon=True, name="fake-oidc")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake issuer did not start")
        return self

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_get("/.well-known/openid-configuration", self.discovery)
        app.router.add_get("/jwks", self.jwks)
        app.router.add_get("/authorize", self.authorize)
        app.router.add_post("/token", self.token)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> FakeIssuer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
