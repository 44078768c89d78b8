"""`/passthrough/{provider}/{path}`: what the gateway does not model, relayed to one provider.

Any method, to the provider's `base_url` with its credentials as its kind sends them
(`Provider.credentials`), only for the paths its config allows (`"passthrough"`: fnmatch
patterns such as `/v1/vector_stores/*`); any other path is a 404 that calls no upstream. Behind a
client key like the relay routes, bounded like them (the body by `server.max_body_bytes`, the
answer by the provider's `max_answer_bytes`, the exchange by its `total` timeout), through the
one transport, the answer redacted (the provider's key never comes back, even echoed), and
counted in metrics under the endpoint `passthrough`.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgspec

from gateway.accounts import auth
from gateway.core.delivery import Whole, error_delivery, internal_error
from gateway.core.record import Outcome, Record, request_id
from gateway.state.runtime import Runtime
from providers.contract.errors import GatewayError, NotFound, TotalTimeout
from providers.contract.provider import Provider
from providers.contract.redact import MIN_SECRET, mask_credentials

PREFIX = "/passthrough/"
ENDPOINT = "passthrough"
# Not relayed from the client: its own credentials (the provider's are injected instead), the
# connection's hop-by-hop headers, what the transport sets itself, the gateway's own.
_DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive",
                      "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection",
                      "authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie",
                      "accept-encoding", "forwarded", "x-forwarded-for", "x-forwarded-host",
                      "x-forwarded-proto", "x-real-ip"})
_CREDENTIALS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key"})
# Of the upstream's answer headers, those a client needs to read the body.
_KEPT = ("content-type", "content-disposition", "retry-after")


class Incoming(Protocol):
    """What passthrough reads of a request (`front.RawRequest`)."""

    scope: Any

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def body(self) -> bytes: ...


def allowed(patterns: list[str] | tuple[str, ...], path: str) -> bool:
    """Whether `path` (normalised: no `..`, no `//`) matches one of `patterns`."""
    if posixpath.normpath(path) != path or "\\" in path:
        return False
    return any(fnmatchcase(path, pattern) for pattern in patterns)


def patterns_of(provider: Provider) -> tuple[str, ...]:
    """The paths this provider's config lets through (`"passthrough"`), none by default."""
    return msgspec.convert(provider.spec.raw.get("passthrough") or (), tuple[str, ...])


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """`path` under `base_url`; a path that already starts with base_url's own path (`/v1`) is
    not doubled: `/v1/files` on `https://api.openai.com/v1` is `https://api.openai.com/v1/files`."""
    base = base_url.rstrip("/")
    parts = urlsplit(base)
    if parts.path and (path == parts.path or path.startswith(parts.path + "/")):
        base = f"{parts.scheme}://{parts.netloc}"
    url = base + path
    return f"{url}?{query.decode('latin-1')}" if query else url


async def handle(request: Incoming, runtime: Runtime) -> Whole:
    """Relay one passthrough request; every failure is the error envelope, redacted."""
    live = runtime.live
    record = Record(request_id(request.headers), ENDPOINT, runtime.listeners)
    try:
        key = auth.check(request.headers, live.snapshot, runtime.accounts)
        record.key_id = key.limits.key_id if key is not None else None
        name, _, rest = request.scope["path"].removeprefix(PREFIX).partition("/")
        provider = live.providers.get(name)
        path = "/" + rest
        if provider is None or not provider.spec.base_url \
                or not allowed(patterns_of(provider), path):
            raise NotFound(f"No passthrough to {path!r} of provider {name!r}: its config "
                           "does not allow it")
        record.provider = name
        return await _relayed(request, provider, path, record, runtime)
    except GatewayError as exc:
        return error_delivery(exc, record, live.redactor)
    except Exception:  # a bug: logged with its traceback and counted, as every request is
        return internal_error(record, live.redactor)


async def _relayed(request: Incoming, provider: Provider, path: str, record: Record,
                   runtime: Runtime) -> Whole:
    spec = provider.spec
    assert spec.base_url is not None
    url = upstream_url(spec.base_url, path, request.scope.get("query_string", b""))
    body = await request.body()
    headers = {name: value for name, value in request.headers.items()
               if name not in _DROPPED and not name.startswith("x-llms-")}
    headers.update(provider.credentials())
    total = spec.timeouts.total
    try:
        async with asyncio.timeout(total):
            response = await provider.transport.request(
                request.scope.get("method", "GET"), url, headers=headers, body=body or None,
                link=spec.link_for(url), connect_timeout=spec.timeouts.connect)
            try:
                payload = await response.read()
            finally:
                response.close()
    except TimeoutError:
        raise TotalTimeout(f"no complete answer within {total:g}s") from None
    # The key, and what the kind sends with it or the config added (an org token): masked
    # byte for byte, in answers that are not text too.
    secrets = [spec.api_key.reveal()] if spec.api_key is not None else []
    secrets += [value for name, value in provider.credentials().items()
                if name.lower() in _CREDENTIALS or name in spec.headers]
    secrets = [s for s in secrets if len(s.strip()) >= MIN_SECRET]
    answer_headers = {**record.headers(), **{
        name: _redacted(value.encode("latin-1"), secrets, runtime).decode("latin-1")
        for name in _KEPT if (value := response.headers.get(name)) is not None}}
    content_type = answer_headers.pop("content-type", "application/octet-stream")
    record.status = response.status
    return Whole(_redacted(payload, secrets, runtime), answer_headers, record, response.status,
                 content_type,
                 Outcome.COMPLETED if response.status < 400 else Outcome.ERROR)


def _redacted(data: bytes, secrets: list[str], runtime: Runtime) -> bytes:
    """`data` without the provider's credentials, byte for byte; text is also scrubbed of
    every configured secret and anything that looks like a credential."""
    for secret in sorted(secrets, key=len, reverse=True):
        data = data.replace(secret.encode("utf-8"), b"***")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # bytes (a file): only the exact credentials are masked
    return runtime.live.redactor.text(mask_credentials(text)).encode("utf-8")
