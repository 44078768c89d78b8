"""Who a request is: anonymous, a client, or an admin; keys compared in constant time.

Keys come as `Authorization: Bearer <key>` or `x-api-key`, checked by `identify`, the one door
of every route that acts for a key (the relay's `keys` stage, passthrough, files and batches,
stored responses, the read routes, the admin routes' key lookup). Client keys
(`server.api_keys`, and the virtual keys an admin created: `gateway.accounts`) use the relay and
read routes; admin keys (`server.admin_keys`) do that too and are the only keys the admin routes
accept, and the only readers of other keys' ids and spend (`is_admin`). With no admin key
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


def identify(headers: Mapping[str, str], snapshot: Snapshot, accounts: Accounts | None = None,
             *, reading: bool = False, public: bool = False) -> GatewayKey | Account | None:
    """The one identity check of every route that acts for a key: the key presented, valid,
    not revoked (the directory holds live keys only) and not expired, else AuthenticationFailed.
    None when the route is open: no key is configured that it needs (client or virtual keys;
    any key, `reading` the gateway's state), or it is `public` and no key was presented (a key
    that is presented is checked even there, so an expired one is refused everywhere)."""
    keyed = snapshot.any_keys if reading else bool(snapshot.keys)
    if not keyed and not (accounts is not None and accounts.keys_required):
        return None
    key = presented_key(headers)
    if key is None:
        if public:
            return None
        raise AuthenticationFailed("Missing API key: send 'Authorization: Bearer <key>'"
                                   + _why(keyed))
    return _known(key, snapshot, accounts, keyed)


async def admitted(headers: Mapping[str, str], snapshot: Snapshot,
                   accounts: Accounts | None = None, *, reading: bool = False,
                   public: bool = False) -> GatewayKey | Account | None:
    """`identify`, where a route would serve without a key only once the accounts say no key
    was made yet as their database holds it now (`Accounts.keyless`): a first key made on
    another worker or replica is required here the moment its admin answer is back."""
    key = identify(headers, snapshot, accounts, reading=reading, public=public)
    if key is None and accounts is not None and not accounts.alone \
            and not await accounts.keyless():
        key = identify(headers, snapshot, accounts, reading=reading, public=public)
    return key


def _known(key: str, snapshot: Snapshot, accounts: Accounts | None, keyed: bool = True
           ) -> GatewayKey | Account:
    matched = _match(key, snapshot.keys + snapshot.admin_keys)
    if matched is not None:
        return matched
    if accounts is not None and (account := accounts.find(key)) is not None:
        return accounts.unexpired(account)
    raise AuthenticationFailed("Invalid API key" + _why(keyed))


def _why(keyed: bool) -> str:
    """Why a gateway whose llms.json sets no key asks for one: a local user whose examples
    send any key at all would otherwise never learn it."""
    if keyed:
        return ""
    return (": this gateway requires a key since a virtual key was made for it (llms-gateway "
            "keys list shows them); send one as 'Authorization: Bearer <key>', or see "
            "docs/teams.md#back-to-an-open-gateway")


def keyed(snapshot: Snapshot, accounts: Accounts | None) -> bool:
    """Whether any key is configured (static, admin or virtual): then a caller's role
    matters."""
    return snapshot.any_keys or (accounts is not None and accounts.keys_required)


def is_admin(key: GatewayKey | Account | None, snapshot: Snapshot, headers: Mapping[str, str],
             peer: str) -> bool:
    """Whether the caller may read every key's state: an admin key, or with no admin key
    configured, a request from this machine that no proxy forwarded (as `check_admin`)."""
    if not snapshot.admin_keys:
        return is_local(peer) and not any(h in headers for h in FORWARDING_HEADERS)
    return isinstance(key, GatewayKey) and any(key is admin for admin in snapshot.admin_keys)


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
    _known(key, snapshot, accounts)  # an unknown or expired key is a 401, as everywhere
    raise PermissionDenied("This key may not use admin routes: they need an admin key")


def is_local(host: str) -> bool:
    """The peer address is this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
