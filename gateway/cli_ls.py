"""`llms-gateway ls`: the providers in the order they are tried, each with its state and models.

A running gateway is asked for what only it knows (its `/status.json`): a provider an admin
disabled, a circuit that is open, the models a `"models": "*"` provider discovered, the pool's
workers. With none answering, the config file's view is printed, and said to be only that.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from gateway.config.snapshots import prices
from gateway.core.facts import Facts
from gateway.core.settings import ADMIN_DISABLED, IN_CONFIG, Snapshot
from providers.contract.spec import ProviderSpec


def local_url(snapshot: Snapshot) -> str:
    """Where the gateway running this config answers (its bind, or loopback for any-address)."""
    server = snapshot.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    return f"http://{host}:{server.port}"


def live_status(root: str, key: str | None,
                direct: bool) -> tuple[dict[str, Any] | None, str]:
    """The gateway's `/status.json` at `root`, or None and why not. `direct` skips the
    environment's proxy (the config's own address is this machine)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(f"{root}/status.json", headers=headers)
    handlers = [urllib.request.ProxyHandler({})] if direct else []
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=3) as answer:
            body: dict[str, Any] = json.load(answer)
    except urllib.error.HTTPError as exc:
        return None, f"the gateway at {root} answered {exc.code} to /status.json" + (
            ": pass its key (--key or $LLMS_GATEWAY_KEY)" if exc.code in (401, 403)
            else "")
    except (OSError, ValueError):
        return None, f"no gateway answering at {root}"
    return body, ""


def state(row: dict[str, Any]) -> str:
    """A provider's state as the running gateway reports it: `enabled`, `disabled (why)`,
    `disabled by an admin`, `circuit open (models)` or `cooling down (…)`."""
    if not row.get("enabled"):
        return disabled(row.get("reason"))
    circuits = row.get("circuits") or ()
    tripped = [str(c["model"]) + (" half-open" if c["state"] == "half_open" else "")
               for c in circuits if c.get("state") in ("open", "half_open")]
    if tripped:
        return f"circuit open ({', '.join(tripped)})"
    if row.get("cooling_down_for"):
        return f"cooling down ({row['cooling_down_for']}s left after a 429)"
    return "enabled"


def disabled(reason: str | None) -> str:
    """How `ls` words a disabled provider."""
    if reason == ADMIN_DISABLED:
        return ADMIN_DISABLED
    if reason in (None, IN_CONFIG):
        return 'disabled ("enabled": false)'
    return f"disabled ({reason})"


def lines(snapshot: Snapshot, live: dict[str, Any] | None,
          facts: dict[tuple[str, str], Facts]) -> Iterator[str]:
    """The listing: one line per provider (number, name, kind, state), then its models with
    their window and price (and where each came from) and, for a pool, its workers; then the
    names served as another alias."""
    rows = {row["name"]: row for row in (live or {}).get("providers") or ()}
    for number, spec in enumerate(snapshot.providers, 1):
        row = rows.get(spec.name)
        if row is not None:
            said = state(row)
        else:
            said = "enabled" if spec.enabled else disabled(spec.disabled_reason)
        yield f"{number:>3}. {spec.name:<14} {spec.kind:<10} {said}"
        yield from _models(spec, row, live is not None, facts)
        for worker in ((row or {}).get("state") or {}).get("workers") or ():
            yield "       " + worker_line(worker)
    names = [*snapshot.names.exact.items(), *snapshot.names.patterns]
    if names:
        yield "names served as another alias (models.*.alias_of):"
    for name, alias in names:
        yield f"       {name} -> {alias}"
    yield from unpriced_lines(snapshot, live)
    yield from mcp_lines(snapshot, live)


def mcp_lines(snapshot: Snapshot, live: dict[str, Any] | None) -> Iterator[str]:
    """The MCP servers behind `/mcp`: each one's transport, and as the running gateway says,
    its state and how many tools it has."""
    if snapshot.mcp_servers:
        yield "MCP servers (mcp_servers), behind /mcp:"
    rows = {row["name"]: row for row in (live or {}).get("mcp_servers") or ()}
    for server in snapshot.mcp_servers:
        transport = "stdio" if server.command else "http"
        row = rows.get(server.name)
        said = f"{row['state']}, {row['tools']} tools" if row is not None else "configured"
        yield f"       {server.name:<14} {transport:<6} {said}"


def unpriced_lines(snapshot: Snapshot, live: dict[str, Any] | None) -> Iterator[str]:
    """The models with no price of their own: those a budgeted key can reach, as the running
    gateway says, else every one in the config (which knows no keys)."""
    if live is not None and "unpriced" in live:
        found = [(u["alias"], u["provider"], u["model"]) for u in live["unpriced"]]
        whose = "a budgeted key can reach"
    else:
        found = [(u.alias, u.provider, u.model) for u in prices(snapshot)[1]]
        whose = "in the config"
    if not found:
        return
    price = snapshot.unpriced
    charged = "refused to budgeted keys" if price is None else \
        f"charged ${price.input:g}/${price.output:g} per M tokens in/out"
    yield f"UNPRICED models {whose} (defaults.unpriced: {charged}):"
    for alias, provider, model in found:
        yield f"  - {alias} on {provider}" + (f" -> {model}" if model != alias else "")


def _models(spec: ProviderSpec, row: dict[str, Any] | None, running: bool,
            facts: dict[tuple[str, str], Facts]) -> Iterator[str]:
    if spec.discovery is not None:
        found = [m["alias"] for m in (row or {}).get("models") or ()]
        if not running:
            yield "       * (discovered at start)"
        elif not found:
            yield "       * (none discovered yet)"
        for alias in found:
            yield f"       {alias}  (discovered)"
        return
    for alias, model in spec.models.items():
        target = f" -> {model.id}" if model.id != alias else ""
        known = facts.get((spec.name, alias))
        yield f"       {alias}{target}{facts_text(known) if known else ''}"


def facts_text(known: Facts) -> str:
    """A model's window, longest answer and price as `ls` prints them, each with its source
    (`config`: llms.json; `genai-prices`: the package's database)."""
    parts = []
    if known.context_window is not None:
        parts.append(f"window {known.context_window} "
                     f"({known.sources['context_window']})")
    if known.max_output_tokens is not None:
        parts.append(f"output {known.max_output_tokens} "
                     f"({known.sources['max_output_tokens']})")
    if known.price is not None:
        parts.append(f"${known.price.input:g}/${known.price.output:g} per M tokens in/out "
                     f"({known.sources['price']})")
    return ("  " + ", ".join(parts)) if parts else ""


def worker_line(worker: dict[str, Any]) -> str:
    """One pool worker as `ls` prints it: name, its state and for how long, how long its start
    took to load (when known), where, load: `ready for 3m20s, loaded in 4.2s`."""
    said = f"{worker['state']} for {duration(worker['for_s'])}"
    if worker.get("load_s") is not None:
        said += f", loaded in {duration(worker['load_s'])}"
    line = (f"worker {worker['name']:<12} {said:<34}  {worker['url']}  "
            f"inflight {worker['inflight']}  restarts {worker['restarts']}")
    return line + (f"  ({worker['last_error']})" if worker.get("last_error") else "")


def duration(seconds: float) -> str:
    """A span as a person reads it: `4.2s`, `3m20s`, `2h05m`."""
    if seconds < 59.95:  # what would print as 60.0s is 1m00s
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
