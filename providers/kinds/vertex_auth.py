"""The `vertex` kind's credentials: OAuth2 access tokens from google-auth.

A service account's key file, or the environment's default credentials (`google.auth.default()`,
looked up on first use). Tokens are refreshed before they expire (google-auth's margin) in a
worker thread, never on the event loop, one refresh shared by every request waiting for it;
google-auth's own HTTP (the token endpoint) is sent by the gateway's transport on the loop, so it
takes the provider's proxy, TLS options and timeouts like every other upstream call.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport
from google.auth.credentials import TokenState
from google.oauth2 import service_account

from providers.contract.errors import (
    GatewayError,
    ProviderError,
    ProviderRejected,
    ProviderUnavailable,
)
from providers.wire.upstream_errors import scrub

SCOPE = "https://www.googleapis.com/auth/cloud-platform"


class Send(Protocol):
    """One HTTP exchange on the event loop: (status, headers, body)."""

    async def __call__(self, method: str, url: str, body: bytes | None,
                       headers: Mapping[str, str]) -> tuple[int, Mapping[str, str], bytes]: ...


class _Response(google.auth.transport.Response):
    def __init__(self, status: int, headers: Mapping[str, str], data: bytes) -> None:
        self._status, self._headers, self._data = status, headers, data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    @property
    def data(self) -> bytes:
        return self._data


class _OnLoop(google.auth.transport.Request):
    """google-auth's HTTP, called from its worker thread, sent by the gateway's transport on
    the event loop (its proxy, TLS options and timeouts)."""

    def __init__(self, send: Send, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._send, self._loop, self._timeout = send, loop, timeout

    def __call__(self, url: str, method: str = "GET", body: Any = None,
                 headers: Mapping[str, str] | None = None, timeout: Any = None,
                 **kwargs: Any) -> _Response:
        data = body.encode() if isinstance(body, str) else body
        sent: Future[tuple[int, Mapping[str, str], bytes]] = asyncio.run_coroutine_threadsafe(
            self._send(method, url, data, headers or {}), self._loop)
        try:
            return _Response(*sent.result(self._timeout + 1))  # the loop's timeout goes first
        except ProviderError as exc:  # google-auth retries or reports its own error type
            raise google.auth.exceptions.TransportError(str(exc)) from exc
        except TimeoutError:
            sent.cancel()
            raise google.auth.exceptions.TransportError("no answer in time") from None


def refresh_error(exc: google.auth.exceptions.GoogleAuthError) -> GatewayError:
    """The failover a failed refresh is: refused credentials are this provider's auth failure,
    an unreachable or failing token server its unavailability."""
    said = exc.args[0] if exc.args and isinstance(exc.args[0], str) else type(exc).__name__
    message = scrub(f"cannot get an access token: {said}")
    if isinstance(exc, google.auth.exceptions.TransportError) or getattr(exc, "retryable",
                                                                          False):
        return ProviderUnavailable(message)
    return ProviderRejected(message)


class AccessTokens:
    """OAuth2 access tokens for one provider, refreshed before they expire (google-auth's
    margin) in a worker thread, never on the event loop; requests arriving during a refresh
    wait for that one."""

    def __init__(self, credentials: google.auth.credentials.Credentials | None, send: Send,
                 timeout: float) -> None:
        self._credentials = credentials  # None until google.auth.default() has found some
        self.project: str | None = None  # the environment's, with default credentials
        self._send = send
        self._timeout = timeout
        self._refused: str | None = None  # a token the upstream answered 401
        self._refreshing: asyncio.Task[None] | None = None

    async def token(self) -> str:
        """A live access token; ProviderRejected or ProviderUnavailable when none can be had."""
        credentials = self._credentials
        if (credentials is None or credentials.token_state is not TokenState.FRESH
                or credentials.token == self._refused):  # STALE: within minutes of its expiry
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
                self._refreshing.add_done_callback(_retrieved)
            await asyncio.shield(self._refreshing)
            credentials = self._credentials
        assert credentials is not None and credentials.token is not None
        return str(credentials.token)

    def use(self, send: Send, timeout: float) -> None:
        """Send google-auth's requests as the newest snapshot's provider does (its proxy, TLS
        options, timeouts): tokens outlive snapshots."""
        self._send, self._timeout = send, timeout

    async def close(self) -> None:
        """Nothing to close: a refresh under way finishes on its own, for its waiters."""

    @property
    def quota_project(self) -> str | None:
        """The project billed for the calls, when the credentials name one."""
        return getattr(self._credentials, "quota_project_id", None)

    def refused(self, token: str) -> None:
        """The upstream refused `token` (revoked, or expired early): the next request gets a
        new one."""
        self._refused = token

    async def _refresh(self) -> None:
        request = _OnLoop(self._send, asyncio.get_running_loop(), self._timeout)
        try:
            await asyncio.to_thread(self._refresh_in_thread, request)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise refresh_error(exc) from None
        # The token endpoint may give the same token again: it is what the account has now.
        self._refused = None

    def _refresh_in_thread(self, request: _OnLoop) -> None:
        if self._credentials is None:  # reads files, may ask a metadata server: not on the loop
            credentials, self.project = google.auth.default(scopes=[SCOPE])
            self._credentials = credentials
        self._credentials.refresh(request)


def _retrieved(task: asyncio.Task[None]) -> None:
    # Every waiter may have left (cancelled clients): the failure is still looked at.
    if not task.cancelled():
        task.exception()


def fingerprint(path: str | None) -> str:
    """What a provider's tokens come from: the key file as it is now, or the environment's
    credentials. The same fingerprint after a reload keeps the tokens held."""
    if path is None:
        return "default credentials"
    try:
        return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
    except OSError as exc:
        raise ValueError(f"credentials: cannot read {path}: {exc.strerror or exc}") from None


def service_account_credentials(path: str) -> service_account.Credentials:
    """The credentials of a service account key file; ValueError (a config error) naming the
    field when it cannot be read or is not one. The key never reaches the message."""
    try:
        credentials: service_account.Credentials = \
            service_account.Credentials.from_service_account_file(str(Path(path).expanduser()),
                                                                  scopes=[SCOPE])
    except OSError as exc:
        raise ValueError(f"credentials: cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"credentials: {path} is not a service account key file "
                         f"({type(exc).__name__})") from None
    return credentials
