"""A fake Vertex AI: Google's OAuth2 token endpoint and the publisher models' endpoints.

The token endpoint checks what Google's does: a JWT-bearer grant whose assertion is signed
(RS256) by a service account it knows (`trust()`, with the account's public key), for Google's
token audience and the cloud-platform scope, not expired; it mints opaque `ya29.` tokens that
live `expires_in` seconds on the fake's own clock (`advance()` moves it, no sleeping). The
model endpoints take only a live minted token (else 401 UNAUTHENTICATED, as Vertex answers)
and only the configured project and location in the path. Gemini calls are answered by
`FakeGemini` (same bodies, same answers, same modes), Claude calls (`publishers/anthropic`,
`rawPredict` / `streamRawPredict`) by a `FakeAnthropic` (its own modes: `fake.anthropic`),
after the checks Vertex adds: `anthropic_version` in the body and no `model`.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.fake_anthropic import FakeAnthropic
from tests.fake_gemini import FakeGemini, gemini_error
from tests.upstream import embedding_problem, vector

JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# google-auth signs every service account assertion for this audience, whatever token_uri is.
TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
ANTHROPIC_VERSION = "vertex-2023-10-16"
UNAUTHENTICATED = ("Request had invalid authentication credentials. Expected OAuth 2 access "
                   "token, login cookie or other valid authentication credential.")
MAX_INSTANCES = 250
EMAIL = "gateway@test-project.iam.gserviceaccount.com"  # the tests' service account


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def service_account(path: Path, token_uri: str, project: str,
                    email: str = EMAIL) -> rsa.RSAPrivateKey:
    """Write a service account key file (a fresh RSA key) whose `token_uri` is the fake's;
    the key is returned so the fake can be told to trust it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": project, "private_key_id": secrets.token_hex(20),
        "private_key": pem, "client_email": email, "client_id": "1234567890",
        "token_uri": token_uri}))
    return key


def assertion_problem(assertion: str, keys: dict[str, rsa.RSAPublicKey],
                      now: float) -> str | None:
    """Why Google's token endpoint would refuse this JWT assertion, if it would."""
    try:
        head, body, signature = assertion.split(".")
        header, claims = json.loads(_b64(head)), json.loads(_b64(body))
    except ValueError:
        return "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe."
    if header.get("alg") != "RS256":
        return "Invalid JWT: unsupported algorithm."
    key = keys.get(claims.get("iss", ""))
    if key is None:
        return "Invalid grant: account not found"
    try:
        key.verify(_b64(signature), f"{head}.{body}".encode(), padding.PKCS1v15(),
                   hashes.SHA256())
    except InvalidSignature:
        return "Invalid JWT Signature."
    if claims.get("aud") != TOKEN_AUDIENCE:
        return "Invalid JWT: audience is not the token endpoint."
    if SCOPE not in str(claims.get("scope", "")).split():
        return "Invalid OAuth scope or ID token audience provided."
    if not claims.get("iat", now + 1e9) - 300 <= now <= claims.get("exp", 0):
        return "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe."
    return None


@dataclass
class FakeVertex(FakeGemini):
    """POST /token, and /v1/projects/{p}/locations/{l}/publishers/{google,anthropic}/models/…"""

    name: str = "vertex"
    project: str = "test-project"
    location: str = "us-central1"
    expires_in: int = 3600  # the lifetime of the tokens minted from now on
    anthropic: FakeAnthropic = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.anthropic = FakeAnthropic(name=self.name)
        self.keys: dict[str, rsa.RSAPublicKey] = {}
        self.minted: dict[str, float] = {}  # token → when it expires, on the fake's clock
        self.skew = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def trust(self, email: str, key: rsa.RSAPrivateKey) -> None:
        """Accept assertions signed by this service account's key."""
        self.keys[email] = key.public_key()

    def now(self) -> float:
        """The fake's clock: tokens live and die by it."""
        return time.time() + self.skew

    def advance(self, seconds: float) -> None:
        """Move the fake's clock on, so tokens minted before may have expired."""
        self.skew += seconds

    def calls(self) -> list[Any]:
        """The model calls received (token requests left out)."""
        return [r for r in self.requests if r.path.startswith("/v1/")]

    def tokens_minted(self) -> list[str]:
        """Every access token minted, oldest first."""
        return list(self.minted)

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self._token)
        models = "/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{call}"
        app.router.add_post(models, self._model)

    async def _token(self, request: web.Request) -> web.Response:
        await self._record(request)
        form = await request.post()
        if form.get("grant_type") != JWT_GRANT:
            return _oauth_error("unsupported_grant_type", "Invalid grant_type")
        if problem := assertion_problem(str(form.get("assertion", "")), self.keys, time.time()):
            return _oauth_error("invalid_grant", problem)
        token = f"ya29.c.fake-{secrets.token_urlsafe(32)}"
        self.minted[token] = self.now() + self.expires_in
        return web.json_response({"access_token": token, "expires_in": self.expires_in,
                                  "token_type": "Bearer"})

    def _denied(self, request: web.Request) -> web.Response | None:
        """Vertex's answer to a call without a live token, or to another project's path."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        expires = self.minted.get(token) if scheme == "Bearer" else None
        if expires is None or expires <= self.now():
            return gemini_error(401, UNAUTHENTICATED)
        project, location = request.match_info["project"], request.match_info["location"]
        if project != self.project:
            return gemini_error(403, f"Permission 'aiplatform.endpoints.predict' denied on "
                                     f"resource 'projects/{project}' (or it may not exist).")
        if location != self.location:
            return gemini_error(404, f"Location {location} is not found or access is "
                                     "unauthorized.")
        return None

    async def _model(self, request: web.Request) -> web.StreamResponse:
        publisher = request.match_info["publisher"]
        model, _, method = request.match_info["call"].partition(":")
        methods = {"google": ("generateContent", "streamGenerateContent", "predict"),
                   "anthropic": ("rawPredict", "streamRawPredict")}.get(publisher, ())
        if (denied := self._denied(request)) is not None or method not in methods:
            await self._record(request)
            return denied or gemini_error(404, f"Publisher Model `{publisher}/{model}` method "
                                               f"{method!r} not found")
        if publisher == "anthropic":
            return await self._claude(request, model, streaming=method == "streamRawPredict")
        if method == "predict":
            return await self._predict(request)
        return await self._generate(request)

    async def _claude(self, request: web.Request, model: str,
                      streaming: bool) -> web.StreamResponse:
        body = await self._record(request)
        if not isinstance(body, dict):
            return _claude_error("Invalid JSON payload received.")
        if body.get("anthropic_version") != ANTHROPIC_VERSION:
            return _claude_error("anthropic_version: Input should be 'vertex-2023-10-16'")
        if "model" in body:
            return _claude_error("model: Extra inputs are not permitted")
        if streaming != bool(body.get("stream")):
            return _claude_error("stream: streamRawPredict streams, rawPredict does not")
        messages = {k: v for k, v in body.items() if k != "anthropic_version"}
        return await self.anthropic.reply(request, {**messages, "model": model})

    async def _predict(self, request: web.Request) -> web.Response:
        """Text embeddings as Vertex answers them: `predictions[].embeddings` with statistics."""
        body = await self._record(request)
        mode = self._next_mode()
        if mode.kind == "status":
            return gemini_error(mode.code, mode.message, body=mode.body)
        instances = body.get("instances") if isinstance(body, dict) else None
        if not isinstance(instances, list) or not 0 < len(instances) <= MAX_INSTANCES:
            return gemini_error(400, f"instances: 1 to {MAX_INSTANCES} instances are allowed")
        parameters = body.get("parameters") or {}
        if problem := embedding_problem(parameters, "outputDimensionality"):
            return gemini_error(400, problem)
        size = parameters.get("outputDimensionality") or 8
        predictions = [{"embeddings": {
            "values": vector(str(one.get("content", "")), size),
            "statistics": {"truncated": False, "token_count": len(str(one.get("content",
                                                                             "")).split())}}}
            for one in instances]
        characters = sum(len(str(one.get("content", ""))) for one in instances)
        return web.json_response({"predictions": predictions,
                                  "metadata": {"billableCharacterCount": characters}})


def _oauth_error(error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=400)


def _claude_error(message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": "invalid_request_error",
                                                         "message": message}}, status=400)
