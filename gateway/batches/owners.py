"""Whose a file or a batch is: the key that made it, by its id (never its secret); and the key a
batch's requests run as, found again by that id when they run."""

from __future__ import annotations

from gateway.accounts.account import Account
from gateway.accounts.service import Accounts
from gateway.core.errors import AuthenticationFailed
from gateway.core.settings import GatewayKey, Snapshot

NOBODY = ""  # the owner of what is made on a gateway without keys


def id_of(key: GatewayKey | Account | None) -> str:
    """The owner id of what `key` makes."""
    return key.limits.key_id if key is not None else NOBODY


def caller(owner_id: str, snapshot: Snapshot, accounts: Accounts | None
           ) -> GatewayKey | Account | None:
    """The key `owner_id` names, that its batch's calls run as (None: no key);
    AuthenticationFailed when it is gone (revoked, removed from the config) or keys were
    turned on since."""
    keyed = bool(snapshot.keys) or (accounts is not None and accounts.keys_required)
    if owner_id == NOBODY:
        if keyed:
            raise AuthenticationFailed("The batch was made without a key; this gateway now "
                                       "needs one")
        return None
    found: GatewayKey | Account | None = next(
        (k for k in snapshot.keys + snapshot.admin_keys if k.limits.key_id == owner_id), None)
    if found is None and accounts is not None:
        found = accounts.directory.known.by_id.get(owner_id)
    if found is None:
        raise AuthenticationFailed("The key that made this batch is no longer valid")
    return found
