"""What the status page and `/admin` show: providers in order, their health, recent traffic."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from gateway.accounts.overview import Overview
from gateway.state.runtime import Runtime


def encoded(runtime: Runtime, body: Any) -> bytes:
    """The gateway's state as JSON for a client: it quotes upstream messages, so it passes the
    live config's redactor."""
    return runtime.live.redactor.encoded(msgspec.json.encode(body))


def providers_view(runtime: Runtime) -> list[dict[str, Any]]:
    """Every provider in file order, with its state, models and circuits."""
    live = runtime.live
    circuits = runtime.health.snapshot()
    rows = []
    for spec in live.snapshot.providers:
        mine = [c for c in circuits if c["provider"] == spec.name]
        cooling = next((c["open_for"] for c in mine if c["state"] == "cooling_down"), None)
        rows.append({
            "name": spec.name,
            "type": spec.kind,
            "enabled": spec.enabled,
            "reason": spec.disabled_reason,
            "models": [{"alias": alias, "id": model.id} for alias, model in spec.models.items()],
            "circuits": [c for c in mine if c["state"] != "cooling_down"],
            "cooling_down_for": cooling,
            "health": _health(spec.enabled, mine),
            "state": provider.live_state() if (provider := live.providers.get(spec.name))
            else None,
            "traffic": runtime.provider_traffic.summary(spec.name),
        })
    return rows


def unpriced_view(runtime: Runtime) -> list[dict[str, Any]]:
    """Every model with no price of its own that some budgeted key may use, and what such a
    key gets (`defaults.unpriced`): "refused", or the price it is charged instead."""
    accounts, live = runtime.accounts, runtime.live
    budgeted = [a for a in accounts.directory.known.by_id.values() if a.scopes] \
        if accounts is not None else []
    if not budgeted or not live.unpriced:
        return []
    policy = "refused" if live.snapshot.unpriced is None \
        else msgspec.to_builtins(live.snapshot.unpriced)
    return [{"alias": u.alias, "provider": u.provider, "model": u.model, "budgeted": policy}
            for u in live.unpriced if any(a.allows(u.alias) for a in budgeted)]


def unknown_prices_view(runtime: Runtime) -> list[dict[str, Any]]:
    """Every route no price is known for: sorted last by price, excluded by `max_price`."""
    return [{"alias": u.alias, "provider": u.provider, "model": u.model}
            for u in runtime.live.unpriced]


def _health(enabled: bool, circuits: list[dict[str, Any]]) -> str:
    if not enabled:
        return "disabled"
    states = {c["state"] for c in circuits}
    if "open" in states or "cooling_down" in states:
        return "degraded"
    return "half_open" if "half_open" in states else "ok"


def status(runtime: Runtime, every_key: bool = True, own: str | None = None
           ) -> dict[str, Any]:
    """The body of `/status.json`, which the status page polls. Unless `every_key`, the
    queue's waiting counts are the caller's own key's alone (`own`; none for no key): a reader
    who is not an admin sees no other key's id."""
    series = runtime.traffic.series()
    queue = runtime.queue.view()
    if not every_key:
        waiting: dict[str, int] = queue["waiting"]  # type: ignore[assignment]
        queue["waiting"] = {key: depth for key, depth in waiting.items() if key == own}
    window = [row for row in series if row["rps"]]
    return {
        "uptime_s": round(time.time() - runtime.started),
        "config": {"source": str(runtime.live.snapshot.source),
                   "last_reload_error": runtime.config_error},
        "tasks": runtime.supervisor.view(),
        "inflight": runtime.inflight,
        # Slots under server.max_concurrency, who waits for one, and who left without.
        "queue": queue,
        "providers": providers_view(runtime),
        # Models a budgeted key may ask for that have no price of their own.
        "unpriced": unpriced_view(runtime),
        # Routes with no known price: last when sorted by price, never within a `max_price`.
        "unknown_prices": unknown_prices_view(runtime),
        # Per alias that hedges: its delay per leading provider, its budget used.
        "hedging": runtime.hedging.view(),
        # Each guardrail of llms.json: what it detects and does, and what it did here.
        "guardrails": runtime.guardrails.view(runtime.live.snapshot),
        "series": series,
        "summary": {
            "rps": round(sum(float(r["rps"] or 0) for r in window[-6:]) / 6, 2),
            "client_errors": sum(int(r["client_errors"] or 0) for r in series),
            # Turned away by a healthy gateway (loading, full): apart from the error rate.
            "not_ready": sum(int(r["not_ready"] or 0) for r in series),
            "shed": sum(int(r["shed"] or 0) for r in series),
            "cache_hits": sum(int(r["cache_hits"] or 0) for r in series),
            "hedges": sum(int(r["hedges"] or 0) for r in series),
            "error_rate": window[-1]["error_rate"] if window else 0.0,
            "p50_ms": window[-1]["p50_ms"] if window else None,
            "p99_ms": window[-1]["p99_ms"] if window else None,
        },
    }


async def accounts_view(runtime: Runtime, spend: Overview | None, details: bool
                        ) -> dict[str, Any]:
    """`/status.json`'s `database` section (whether it answers, what waits to be written) and,
    for a reader who may see every key's (an admin), its `spend` section: it names keys and
    their dollars."""
    if runtime.accounts is None:
        return {}
    body: dict[str, Any] = {"database": runtime.accounts.status()}
    if details and spend is not None:
        body["spend"] = await spend.view()
    return body
