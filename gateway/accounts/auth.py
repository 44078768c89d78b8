"""Who a request is: anonymous, a client, or an admin; keys compared in constant time.

Keys come as `Authorization: Bearer <key>` or `x-api-key`. Client keys (`server.api_keys`, and the
virtual keys an admin created: `gateway.accounts`) use the relay and read routes; admin keys
(`server.admin_keys`) do that too and are the only keys the admin routes accept. With no admin key
configured, admin routes answer this machine alone, and a request a proxy forwarded (it says so in
a header) does not count as this machine.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.core.errors import AuthenticationFailed, PermissionDenied
from gateway.core.settings import GatewayKey, Snapshot

if TYPE_CHECKING:
    from gateway.accounts.account import Account
    from gateway.accounts.service import Accounts

# Headers a reverse proxy adds: a request carrying one came from elsewhere, whatever its peer.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key the client sent, if any."""
    authorization = headers.get("authorization")
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return headers.get("x-api-key")


def _match(presented: str, keys: tuple[GatewayKey, ...]) -> GatewayKey | None:
    # Compare against every key so the time taken does not reveal which one nearly matched.
    encoded = presented.encode()
    matched = None
    for expected in keys:
        if hmac.compare_digest(encoded, expected.secret.reveal().encode()):
            matched = expected
    return matched


def check(headers: Mapping[str, str], snapshot: Snapshot, accounts: Accounts | None = None
          ) -> GatewayKey | Account | None:
    """The client, admin or virtual key presented; AuthenticationFailed unless client keys are
    off (no `server.api_keys` and no virtual key) or it matches one."""
    if not snapshot.keys and not (accounts is not None and accounts.keys_required):
        return None
    return _known(headers, snapshot.keys + snapshot.admin_keys, accounts)


def _known(headers: Mapping[str, str], keys: tuple[GatewayKey, ...],
           accounts: Accounts | None) -> GatewayKey | Account:
    key = presented_key(headers)
    if key is None:
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'")
    matched = _match(key, keys)
    if matched is not None:
        return matched
    if accounts is not None and (account := accounts.find(key)) is not None:
        return accounts.unexpired(account)
    raise AuthenticationFailed("Invalid API key")


def _keyed(snapshot: Snapshot, accounts: Accounts | None) -> bool:
    return snapshot.any_keys or (accounts is not None and accounts.keys_required)


def check_reader(headers: Mapping[str, str], snapshot: Snapshot, path: str,
                 accounts: Accounts | None = None) -> None:
    """A read route (models, metrics, status): any key when keys are configured, unless the
    path is listed in `server.public_paths`."""
    if _keyed(snapshot, accounts) and path not in snapshot.server.public_paths:
        _known(headers, snapshot.keys + snapshot.admin_keys, accounts)


def authenticated(headers: Mapping[str, str], snapshot: Snapshot,
                  accounts: Accounts | None = None) -> bool:
    """Whether the request may see details: no keys are configured, or it sent a valid one."""
    if not _keyed(snapshot, accounts):
        return True
    try:
        _known(headers, snapshot.keys + snapshot.admin_keys, accounts)
    except AuthenticationFailed:
        return False
    return True


LOCAL_ADMIN = "local"  # the actor of admin actions when no admin key is configured


def check_admin(headers: Mapping[str, str], snapshot: Snapshot, peer: str,
                accounts: Accounts | None = None) -> str:
    """An admin route: an admin key (401 without one, 403 for a client or virtual key), or
    with no admin key configured a request from this machine that no proxy forwarded. Who
    acts: the admin key's id, or `local`."""
    if not snapshot.admin_keys:
        if not is_local(peer) or any(h in headers for h in FORWARDING_HEADERS):
            raise PermissionDenied("Admin routes answer only this machine unless "
                                   "server.admin_keys is set")
        return LOCAL_ADMIN
    key = presented_key(headers)
    if key is None:
        raise AuthenticationFailed("Missing admin key: send 'Authorization: Bearer <key>'")
    if (admin := _match(key, snapshot.admin_keys)) is not None:
        return admin.limits.key_id
    if _match(key, snapshot.keys) is not None \
            or (accounts is not None and accounts.find(key) is not None):
        raise PermissionDenied("This key may not use admin routes: they need an admin key")
    raise AuthenticationFailed("Invalid API key")


def is_local(host: str) -> bool:
    """The peer address is this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
