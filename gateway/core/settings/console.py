"""The web console's settings (`ui` in llms.json, `gateway.console`)."""

from __future__ import annotations

from typing import Annotated

import msgspec


class OidcRoles(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Which console role a signed-in person gets, from a claim of their ID token (a list of
    groups, or one string): `admin` first, then `viewer`, then `team_admin`; none, no session."""

    claim: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "groups"
    admin: tuple[str, ...] = ()
    viewer: tuple[str, ...] = ()  # reads everything, writes nothing
    team_admin: dict[str, str] = {}  # group -> the team whose keys, spend and logs it runs


class OidcConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Single sign-on to the console (`gateway.console.oidc`): the issuer's discovery document
    names its endpoints and keys; `https`, or `http` on this machine only."""

    issuer: Annotated[str, msgspec.Meta(min_length=1, max_length=2048)]
    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    client_secret: str = ""  # "$NAME" read from the environment
    roles: OidcRoles = OidcRoles()
    scopes: tuple[str, ...] = ("openid", "email", "profile")
    # Where the issuer sends the browser back; else this gateway's own `/ui/callback`.
    redirect_uri: str | None = None


class UiConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The web console at `/ui` (`gateway.console`): who may sign in, and for how long."""

    oidc: OidcConfig | None = None
    key_login: bool = True  # an admin key signs in to the console; false: single sign-on only
    session_hours: Annotated[float, msgspec.Meta(gt=0, le=168)] = 8.0
