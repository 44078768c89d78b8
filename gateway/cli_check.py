"""`llms-gateway check`: each enabled provider sent a one-token request, a pool's models through
the workers of the gateway running the config."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import msgspec

from gateway.core.settings import Snapshot
from providers.contract.errors import GatewayError, ProviderError
from providers.contract.provider import Provider
from providers.contract.redact import Redactor
from providers.transport import AiohttpTransport

KEY_ENV = "LLMS_GATEWAY_KEY"  # the key commands send a running gateway, as clients do


def _running_pool(snapshot: Snapshot, name: str, key: str | None
                  ) -> list[dict[str, Any]] | str:
    """Pool `name`'s workers as the gateway running this config reports them (its `/ready`),
    or why they cannot be read (no gateway answers there, or it refused the key)."""
    server = snapshot.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"http://{host}:{server.port}/ready", headers=headers)
    try:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback
        with direct.open(request, timeout=3) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as exc:  # 503 while loading: its body says what loads
        if exc.code in (401, 403):
            return (f"the running gateway answered {exc.code} to /ready: pass its key "
                    f"(--key or ${KEY_ENV})")
        try:
            body = json.load(exc)
        except ValueError:
            return f"the running gateway answered {exc.code} to /ready"
    except (OSError, ValueError):
        return "no gateway answers at this config's address: start it (llms-gateway serve)"
    for provider in body.get("providers") or ():
        if provider.get("name") == name:
            return list((provider.get("state") or {}).get("workers") or ())
    return []


def _ready_worker(workers: list[dict[str, Any]] | str, model: str) -> tuple[str | None, str]:
    """A ready worker's URL for `model`, or None and why there is none."""
    if isinstance(workers, str):
        return None, workers
    mine = [w for w in workers if model in (w.get("models") or ()) or not w.get("spawned")]
    ready = [w for w in mine if w.get("state") == "ready"]
    if ready:
        return str(ready[0]["url"]), "ready"
    states = ", ".join(f"{w.get('name')} {w.get('state')}" for w in mine) or "no worker"
    return None, f"not ready in the running gateway ({states})"


def check(snapshot: Snapshot, provider: str | None, key: str | None) -> int:
    """`llms-gateway check`: a tiny request to each enabled provider (or `provider`); a pool's
    models through the workers of the gateway running this config (asked with `key`)."""
    specs = [p for p in snapshot.providers if provider in (None, p.name)]
    if not specs:
        print(f"no provider named {provider!r}", file=sys.stderr)
        return 2
    return asyncio.run(_check_all(snapshot, [s.name for s in specs], key))


async def _check_all(snapshot: Snapshot, names: list[str], key: str | None) -> int:
    import providers
    from gateway.adapters.responses.store import ResponseStore
    from gateway.state.runtime import build
    from providers.contract.provider import Outgoing

    failures = 0
    kinds = providers.load_kinds()
    async with AiohttpTransport() as transport:
        responses = snapshot.responses  # a check stores nothing: any store will do
        live = build(snapshot, transport, kinds,
                     ResponseStore(responses.store_max_bytes, responses.store_max_entry_bytes))
        for spec in snapshot.providers:
            if spec.name not in names:
                continue
            if not spec.enabled:
                print(f"{spec.name:<14} skipped ({spec.disabled_reason})")
                continue
            if spec.discovery is not None:  # "models": "*": its listing is what to check
                failures += not await _check_listing(live.providers[spec.name], spec.name,
                                                     live.redactor)
                continue
            # A pool runs inside the gateway: its workers are asked where the gateway says.
            workers = _running_pool(snapshot, spec.name, key) if spec.kind == "pool" else []
            for alias, model in spec.models.items():
                provider: Provider = live.providers[spec.name]
                if spec.kind == "pool":
                    url, why = _ready_worker(workers, model.id)
                    if url is None:
                        failures += 1
                        print(live.redactor.text(f"{spec.name:<14} {alias:<28} {why}"))
                        continue
                    provider = kinds["openai"](dataclasses.replace(
                        spec, kind="openai", base_url=url, api_key=None), transport)
                body = {"model": alias, "max_tokens": 1,
                        "messages": [{"role": "user", "content": "Say OK."}]}
                request = Outgoing("chat/completions", msgspec.json.encode(body), alias, False,
                                   "check")
                started = time.perf_counter()
                try:
                    await provider.send(request, model.id)
                    outcome = "ok"
                except GatewayError as exc:
                    failures += 1
                    outcome = f"error: {_what_failed(exc)} {exc.message}"
                elapsed = (time.perf_counter() - started) * 1000
                print(live.redactor.text(
                    f"{spec.name:<14} {alias:<28} {elapsed:8.0f} ms  {outcome}"))
    return 1 if failures else 0


async def _check_listing(provider: Provider, name: str, redactor: Redactor) -> bool:
    """List a `"models": "*"` provider's models, as the gateway does at start; True if it could."""
    started = time.perf_counter()
    try:
        listed = await provider.list_models()
        outcome = f"ok: lists {len(listed)} models"
    except GatewayError as exc:
        outcome = f"error: {_what_failed(exc)} {exc.message}"
    except NotImplementedError:
        outcome = "error: this kind of provider cannot list its models"
    elapsed = (time.perf_counter() - started) * 1000
    print(redactor.text(f"{name:<14} {'* (listing)':<28} {elapsed:8.0f} ms  {outcome}"))
    return outcome.startswith("ok")


def _what_failed(error: GatewayError) -> str:
    """The upstream's own status when it answered (a 503 is a 503, not the 502 a client of the
    gateway would get), else what kind of failure it was (`unavailable`, `connect_timeout`)."""
    if isinstance(error, ProviderError):
        return str(error.upstream_status) if error.upstream_status else f"{error.reason}:"
    return str(error.status)
