"""Services keys: `Authorization: Bearer <key>` or `x-api-key`, compared in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from gateway.config import GatewayKey
from providers.contract.errors import AuthenticationFailed


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key the client sent, if any."""
    authorization = headers.get("authorization")
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return headers.get("x-api-key")


def check(headers: Mapping[str, str], keys: tuple[GatewayKey, ...]) -> GatewayKey | None:
    """The key the client presented; AuthenticationFailed unless `keys` is empty or it matches."""
    if not keys:
        return None
    key = presented_key(headers)
    if key is None:
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'")
    # Compare against every key so the time taken does not reveal which one nearly matched.
    presented = key.encode()
    matched = None
    for expected in keys:
        if hmac.compare_digest(presented, expected.secret.reveal().encode()):
            matched = expected
    if matched is None:
        raise AuthenticationFailed("Invalid API key")
    return matched
