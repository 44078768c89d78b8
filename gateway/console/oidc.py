"""OpenID Connect, the authorization code flow with PKCE, `state` and `nonce`, for the
console's sign-in; ID tokens checked with joserfc.

The issuer's endpoints come from its discovery document and its keys from its JWKS, both
fetched on first use and kept by this process. A token signed with a key id not yet known makes
the JWKS be fetched again (an issuer rotating its keys), at most `MAX_REFETCHES` times a
`REFETCH_WINDOW`, so tokens with made-up key ids cannot make the gateway hammer the issuer.
Every check that fails is a `LoginRefused` naming what failed; none opens a session.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgspec
from joserfc import jwt
from joserfc.errors import ExpiredTokenError, InvalidClaimError, JoseError, MissingClaimError
from joserfc.jwk import KeySet

from gateway.config.ui import url_problem
from gateway.core.settings.console import OidcConfig

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
MAX_REFETCHES = 3
REFETCH_WINDOW = 60.0
LEEWAY = 30  # seconds of clock skew tolerated between the issuer and this machine
MAX_DOCUMENT_BYTES = 1024 * 1024  # a discovery document, a JWKS or a token answer
TIMEOUT = aiohttp.ClientTimeout(total=10)


class LoginRefused(Exception):
    """A sign-in that must not open a session; the message says why, for the 401 page."""


class Discovery(msgspec.Struct, frozen=True):
    """The fields of the issuer's `/.well-known/openid-configuration` the flow uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


class Flow(msgspec.Struct, frozen=True):
    """One sign-in under way, kept in the browser's cookie until the issuer sends it back."""

    state: str
    nonce: str
    verifier: str

    @classmethod
    def new(cls) -> Flow:
        return cls(secrets.token_urlsafe(24), secrets.token_urlsafe(24),
                   secrets.token_urlsafe(48))

    @property
    def challenge(self) -> str:
        """The PKCE S256 challenge of the verifier."""
        digest = hashlib.sha256(self.verifier.encode()).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Issuer:
    """One configured issuer, its endpoints and keys as this process last fetched them."""

    def __init__(self, config: OidcConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._discovery: Discovery | None = None
        self._keys: KeySet | None = None
        self._refetched: deque[float] = deque(maxlen=MAX_REFETCHES)

    async def authorization_url(self, flow: Flow, redirect_uri: str) -> str:
        """Where the browser goes to sign in."""
        found = await self.discovery()
        query = urlencode({"response_type": "code", "client_id": self.config.client_id,
                           "redirect_uri": redirect_uri, "scope": " ".join(self.config.scopes),
                           "state": flow.state, "nonce": flow.nonce,
                           "code_challenge": flow.challenge, "code_challenge_method": "S256"})
        joiner = "&" if "?" in found.authorization_endpoint else "?"
        return f"{found.authorization_endpoint}{joiner}{query}"

    async def discovery(self) -> Discovery:
        if self._discovery is None:
            raw = await _fetch(f"{self.config.issuer}/.well-known/openid-configuration")
            try:
                found = msgspec.convert(raw, Discovery)
            except msgspec.ValidationError as exc:
                raise LoginRefused(f"The issuer's discovery document is not usable: {exc}"
                                   ) from None
            if found.issuer.rstrip("/") != self.config.issuer:
                raise LoginRefused("The issuer's discovery document names another issuer")
            for url in (found.authorization_endpoint, found.token_endpoint, found.jwks_uri):
                if problem := url_problem(url):
                    raise LoginRefused(f"The issuer's discovery document: {problem}")
            self._discovery = found
        return self._discovery

    async def exchange(self, code: str, flow: Flow, redirect_uri: str) -> str:
        """The ID token the issuer gives for `code` (with the PKCE verifier)."""
        found = await self.discovery()
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                "client_id": self.config.client_id, "code_verifier": flow.verifier}
        if self.config.client_secret:
            form["client_secret"] = self.config.client_secret
        answer = await _fetch(found.token_endpoint, form)
        token = answer.get("id_token") if isinstance(answer, dict) else None
        if not isinstance(token, str):
            raise LoginRefused("The issuer's token answer has no ID token")
        return token

    async def verify(self, token: str, flow: Flow, now: float | None = None) -> dict[str, Any]:
        """The claims of an ID token whose signature, `iss`, `aud`, expiry and `nonce` hold."""
        header = _header(token)
        if header.get("alg") not in ALGORITHMS:
            raise LoginRefused("The ID token is not signed with an accepted algorithm")
        keys = await self._keys_for(header.get("kid"))
        try:
            claims = jwt.decode(token, keys, algorithms=list(ALGORITHMS)).claims
        except (JoseError, ValueError):
            raise LoginRefused("The ID token's signature does not verify with the issuer's "
                               "keys") from None
        registry = jwt.JWTClaimsRegistry(
            now=int(time.time() if now is None else now), leeway=LEEWAY,
            iss={"essential": True, "value": self.config.issuer},
            aud={"essential": True, "value": self.config.client_id},
            exp={"essential": True}, sub={"essential": True},
            nonce={"essential": True, "value": flow.nonce})
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            raise LoginRefused("The ID token has expired") from None
        except (InvalidClaimError, MissingClaimError) as exc:
            raise LoginRefused(f"The ID token's claims do not hold: {exc.description}"
                               ) from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.config.client_id:
            raise LoginRefused("The ID token was issued to another party (azp)")
        return dict(claims)

    async def _keys_for(self, kid: Any) -> KeySet:
        if self._keys is None or (kid is not None and kid not in _kids(self._keys)
                                  and self._may_refetch()):
            raw = await _fetch((await self.discovery()).jwks_uri)
            try:
                signing = [k for k in raw["keys"] if k.get("use", "sig") == "sig"]
                self._keys = KeySet.import_key_set({"keys": signing})
            except (JoseError, ValueError, KeyError, TypeError, AttributeError):
                raise LoginRefused("The issuer's JWKS is not a set of keys") from None
        return self._keys

    def _may_refetch(self) -> bool:
        now = self._clock()
        if len(self._refetched) == MAX_REFETCHES and now - self._refetched[0] < REFETCH_WINDOW:
            return False
        self._refetched.append(now)
        return True


def _kids(keys: KeySet) -> set[str]:
    return {k.kid for k in keys.keys if k.kid is not None}


def _header(token: str) -> dict[str, Any]:
    """The JOSE header of a compact token, unverified (it picks the key to verify with)."""
    try:
        first = token.split(".", 1)[0]
        header = json.loads(base64.urlsafe_b64decode(first + "=" * (-len(first) % 4)))
    except (ValueError, UnicodeDecodeError):
        raise LoginRefused("The ID token is not a signed token") from None
    if not isinstance(header, dict):
        raise LoginRefused("The ID token is not a signed token")
    return header


async def _fetch(url: str, form: Mapping[str, str] | None = None) -> Any:
    """A JSON document from the issuer (a POSTed form when `form`), bounded in time and size."""
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT, trust_env=True) as session:
            method = session.post(url, data=dict(form)) if form is not None \
                else session.get(url)
            async with method as answer:
                body = await answer.content.read(MAX_DOCUMENT_BYTES + 1)
                status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise LoginRefused(f"The issuer could not be reached ({type(exc).__name__})") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise LoginRefused("The issuer's answer is larger than the gateway reads")
    if status != 200:
        raise LoginRefused(f"The issuer answered {status}")
    try:
        return json.loads(body)
    except ValueError:
        raise LoginRefused("The issuer's answer is not JSON") from None
