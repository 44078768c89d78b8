"""`/passthrough/{provider}/{path}`: what the gateway does not model, relayed to one provider.

Any method, to the provider's `base_url` with its credentials as its kind sends them
(`Provider.credentials`), only for the paths its config allows (`"passthrough"`: fnmatch
patterns such as `/v1/vector_stores/*`), matched on the path exactly as it is sent
(`passthrough_paths.sent_path`: a dot segment, encoded or not, is a 400); any other path is a
404 that calls no upstream. Behind a client key like the relay routes (`auth.identify`), a
virtual key's rules applied as there: its model list when the path or body names a model, its
parallel limit, its budget's hold, charged by the answer's usage. Bounded like them (the body
by `server.max_body_bytes`, the answer by the provider's `max_answer_bytes`, the exchange by
its `total` timeout), through the one transport, the answer redacted (the provider's key never
comes back, even echoed), and counted in metrics under the endpoint `passthrough`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import msgspec

from gateway.accounts import auth, pricing
from gateway.accounts.account import NANO, Account
from gateway.accounts.service import Accounts, Charge
from gateway.accounts.stage import rate_limited
from gateway.core.delivery import Whole, error_delivery, internal_error
from gateway.core.record import Outcome, Record, request_id
from gateway.core.settings import Route
from gateway.edge.passthrough_paths import named_model, sent_path
from gateway.state.runtime import Live, Runtime
from providers.contract.errors import GatewayError, NotFound, TotalTimeout
from providers.contract.provider import Provider
from providers.contract.redact import MIN_SECRET, mask_credentials
from providers.contract.usage import cost, from_payload

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
    """Whether `path`, as it is sent (`sent_path`: no dot segment, no `//`), matches one of
    `patterns`."""
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
        key = await auth.admitted(request.headers, live.snapshot, runtime.accounts)
        record.key_id = key.limits.key_id if key is not None else None
        if key is not None:  # a key's per-minute limits, as on the relay
            team = key.team_limits if isinstance(key, Account) else None
            if (left := runtime.limiter.admit(key.limits, team)) is not None:
                rate_limited(record, left)
        scope = request.scope
        raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        name, _, rest = raw.removeprefix(PREFIX).partition("/")
        name = unquote(name)
        provider = live.providers.get(name)
        path = sent_path("/" + rest)
        if provider is None or not provider.spec.base_url \
                or not allowed(patterns_of(provider), path):
            raise NotFound(f"No passthrough to {path[:200]!r} of provider {name[:64]!r}: its "
                           "config does not allow it")
        record.provider = name
        body = await request.body()
        if isinstance(key, Account) and runtime.accounts is not None:
            await _charged(runtime.accounts, key, record, live, name, path, body,
                           request.headers)
        return await _relayed(request, provider, path, body, record, runtime)
    except GatewayError as exc:
        return error_delivery(exc, record, live.redactor)
    except Exception:  # a bug: logged with its traceback and counted, as every request is
        return internal_error(record, live.redactor)


async def _charged(accounts: Accounts, account: Account, record: Record, live: Live,
                   provider: str, path: str, body: bytes, headers: Mapping[str, str]) -> None:
    """A virtual key's rules, as on the relay: its parallel limit, its model list for a model
    the path or body names, and its budget's hold (priced at that model's alias here, else the
    least a hold is, so a spent budget refuses)."""
    accounts.check(account, record)
    alias: str | None = None
    routes: tuple[Route, ...] = ()
    if (model := named_model(path, body, headers)) is not None:
        record.model = model
        served = _aliases(live, provider, model)
        alias = next((a for a in served if account.allows(a)), None)
        accounts.check_model(account, alias, model)
        if alias is not None:
            record.alias, record.known_model = alias, True
            routes = tuple(r for r in live.snapshot.routes[alias] if r.provider == provider)
    await accounts.reserve(record, pricing.estimate(record.endpoint, body),
                           [(alias or "", route) for route in routes], live.prices)


def _aliases(live: Live, provider: str, model: str) -> list[str]:
    """The aliases `provider` serves `model` for (its upstream id, or an alias's name)."""
    return [alias for alias, routes in live.snapshot.routes.items()
            if any(r.provider == provider and model in (r.upstream_model, alias)
                   for r in routes)]


async def _relayed(request: Incoming, provider: Provider, path: str, body: bytes,
                   record: Record, runtime: Runtime) -> Whole:
    spec = provider.spec
    assert spec.base_url is not None
    url = upstream_url(spec.base_url, path, request.scope.get("query_string", b""))
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
    _priced(record, payload, request.scope.get("method", "GET"), runtime)
    return Whole(_redacted(payload, secrets, runtime), answer_headers, record, response.status,
                 content_type,
                 Outcome.COMPLETED if response.status < 400 else Outcome.ERROR)


def _priced(record: Record, payload: bytes, method: str, runtime: Runtime) -> None:
    """What a held request is charged: its answer's usage at its alias's price; a POST
    answered without a usage, its hold (it may have made something that cost)."""
    charge = record.charge
    if not isinstance(charge, Charge) or charge.hold is None or record.status >= 400:
        return
    price = runtime.price_of(record.provider or "", record.alias or "")
    if price is not None and (usage := from_payload(payload)) is not None:
        record.usage, record.cost = usage, cost(usage, price)
    elif method == "POST":
        record.cost = charge.hold.amount / NANO


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
