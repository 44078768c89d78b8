"""`llms-gateway`: serve, ls, check, chat, usage, keys, teams, spend."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from gateway import cli_accounts, cli_chat, cli_ls, config
from gateway.config.loader import (
    BIND_ENV,
    CONFIG_ENV,
    DATABASE_FILE,
    OPEN_ENV,
    STATE_DIR_ENV,
    WORKERS_ENV,
    state_dir,
    users_state_dir,
)
from gateway.config.snapshots import is_loopback, model_facts
from gateway.core.settings import ConfigError, Snapshot
from gateway.edge import openfiles
from providers.contract.errors import GatewayError, ProviderError, ProviderUnavailable
from providers.contract.provider import Provider
from providers.contract.redact import Redactor
from providers.transport import AiohttpTransport

DEFAULT_URL = "http://127.0.0.1:8000/v1"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llms-gateway` command."""
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"llms-gateway: invalid config: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader left (`ls | head`): the rest is not wanted. Python flushes stdout again
        # at exit and would fail there too, so from here stdout goes nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llms-gateway", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="config file (default: $LLMS_CONFIG, ./llms.json, "
                                        "~/.llms/llms.json)")
    serve.add_argument("--host", help="address to bind (default: server.host)")
    serve.add_argument("--port", type=int, help="port to bind (default: server.port)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default: 1)")
    serve.add_argument("--allow-unauthenticated", action="store_true",
                       help="serve a non-loopback address without server.api_keys")
    serve.set_defaults(run=_serve)

    ls = commands.add_parser("ls", help="list providers in order, their state and the models "
                                        "each serves (live from a running gateway)")
    ls.add_argument("--config")
    ls.add_argument("--url", help="the running gateway to ask (default: the config's "
                                  "server.host and server.port)")
    ls.set_defaults(run=_ls)

    check = commands.add_parser("check", help="send a tiny request to each enabled provider")
    check.add_argument("provider", nargs="?", help="only this provider")
    check.add_argument("--config")
    check.set_defaults(run=_check)

    chat = commands.add_parser("chat", help="stream an answer through a running gateway; with "
                                             "no prompt, a conversation read from stdin")
    chat.add_argument("-m", "--model", required=True)
    chat.add_argument("prompt", nargs="?",
                      help="what to ask; without it, each line read is a turn (EOF or /exit "
                           "ends)")
    chat.add_argument("--system", help="a system message before the conversation")
    chat.add_argument("--max-tokens", type=int, help="the most tokens an answer may have")
    chat.add_argument("--temperature", type=float, help="sampling temperature")
    chat.add_argument("--url", default=os.environ.get("LLMS_GATEWAY_URL", DEFAULT_URL))
    chat.add_argument("--key", default=os.environ.get("LLMS_GATEWAY_KEY"))
    chat.set_defaults(run=_chat)

    usage = commands.add_parser("usage", help="requests, tokens and cost per provider and model "
                                              "from a running gateway")
    usage.add_argument("--url", default=os.environ.get("LLMS_GATEWAY_URL", DEFAULT_URL))
    usage.set_defaults(run=_usage)

    cli_accounts.add_commands(commands)  # keys, teams, spend: the admin API of a running gateway
    return parser


def _version() -> str:
    """The installed package's version (its metadata, not a constant kept by hand)."""
    try:
        return importlib.metadata.version("llms-gateway")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a source tree)"


def _load(path: str | None) -> tuple[Path, Snapshot]:
    found = config.discover(path)
    return found, config.load(found)


def _serve(args: argparse.Namespace) -> int:
    import providers
    from gateway.edge import serving
    from gateway.state.runtime import check_kinds

    path, snapshot = _load(args.config)
    check_kinds(snapshot, providers.load_kinds())
    os.environ[CONFIG_ENV] = str(path.resolve())  # the app factory in each worker reads it
    # This gateway's own state folder, for every process it starts (the pool's workers' logs
    # and lock among them): chosen once, here, from the config file's path.
    os.environ[STATE_DIR_ENV] = str(state_dir(os.environ, path))
    _state_moved(snapshot)
    os.environ[WORKERS_ENV] = str(args.workers)  # budgets shared between them (accounts)
    if args.workers > 1 and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # Each worker writes its metrics here; /metrics on any worker sums them all.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="llms-gateway-metrics-")
    host = args.host or snapshot.server.host
    port = snapshot.server.port if args.port is None else args.port
    allowed = args.allow_unauthenticated or snapshot.server.allow_unauthenticated
    # What each worker's reload checks a new config against (`config.weakening`).
    os.environ[BIND_ENV] = host
    if args.allow_unauthenticated:
        os.environ[OPEN_ENV] = "1"
    if not snapshot.keys and not is_loopback(host) and not allowed:
        print(f"llms-gateway: refusing to serve {host} without API keys: anyone who can reach "
              f"it could spend your provider credits. Set server.api_keys (e.g. "
              f'["$LLMS_GATEWAY_KEY"] with that variable set), bind 127.0.0.1, or pass '
              f"--allow-unauthenticated.", file=sys.stderr)
        return 2
    if not _migrate(snapshot):
        return 2
    open_files = openfiles.raise_limit()
    # Half: the default max_concurrency is a safety valve, not a sizing, and a hard limit of
    # 20,000 (carrying ~9,900) is not worth a warning at every start; 4,096 (~1,900) is.
    if (carried := openfiles.requests_within(open_files)) < snapshot.server.max_concurrency / 2:
        print(f"llms-gateway: the open-file limit ({open_files}) carries about {carried} "
              f"requests at once, fewer than server.max_concurrency "
              f"({snapshot.server.max_concurrency}): past it, connections fail with 'Too many "
              f"open files'. Raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker "
              f"--ulimit nofile=) or lower max_concurrency.", file=sys.stderr)
    print(f"llms-gateway: serving http://{host}:{port}/v1 with {path}; its state in "
          f"{os.environ[STATE_DIR_ENV]}", file=sys.stderr)
    serving.launch(snapshot.server, host, port, args.workers, open_files)


def _state_moved(snapshot: Snapshot) -> None:
    """Say where an earlier version's database is, the first time this gateway starts without
    it: it was shared by every gateway of this user, and is no longer read by default."""
    state = Path(os.environ[STATE_DIR_ENV])
    earlier = users_state_dir(os.environ) / DATABASE_FILE
    default = snapshot.database.url == f"sqlite:///{state / DATABASE_FILE}"
    if default and earlier.exists() and not (state / DATABASE_FILE).exists():
        print(f"llms-gateway: each gateway now keeps its own state ({state}); the accounts "
              f"database earlier versions shared between all your gateways stays at {earlier}: "
              f'to keep its keys and spend here, set "database": {{"url": '
              f'"sqlite:///{earlier}"}} in llms.json', file=sys.stderr)


def _migrate(snapshot: Snapshot) -> bool:
    """Move the accounts database's schema forward once, before the workers start; False when
    it must not be served (a newer schema: said on stderr). It runs in a child process, so the
    server's own process never holds the database libraries (a database that is down is the
    workers' to retry)."""
    if snapshot.database.url is None:
        return True
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's end is its exit status
        os._exit(_migrate_here(snapshot.database.url))
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) != 2


def _migrate_here(url: str) -> int:
    from gateway.accounts.database import Database, SchemaTooNew

    try:
        Database(url).migrate_now()
    except SchemaTooNew as exc:
        print(f"llms-gateway: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:  # down or unreachable: served on static keys until it is back
        print(f"llms-gateway: the accounts database cannot be migrated now "
              f"({type(exc).__name__}); the workers will retry", file=sys.stderr, flush=True)
    return 0


def _ls(args: argparse.Namespace) -> int:
    path, snapshot = _load(args.config)
    root = (args.url or cli_ls.local_url(snapshot)).rstrip("/").removesuffix("/v1")
    keys = snapshot.admin_keys + snapshot.keys  # /status.json answers any of them
    live, why = cli_ls.live_status(root, keys[0].secret.reveal() if keys else None,
                                   direct=args.url is None)
    print(f"{path} ({len(snapshot.providers)} providers, tried in this order)")
    for line in cli_ls.lines(snapshot, live, model_facts(snapshot)):
        print(line)
    if live is None:
        print(f"({why}: this is the config's view; admin switches, open circuits, discovered "
              f"models and pool workers show while it runs)")
    return 0


def _running_pool(snapshot: Snapshot, name: str) -> list[dict[str, Any]] | None:
    """Pool `name`'s workers as the gateway running this config reports them (its `/ready`),
    or None when no gateway answers there."""
    server = snapshot.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    keys = snapshot.admin_keys + snapshot.keys
    headers = {"Authorization": f"Bearer {keys[0].secret.reveal()}"} if keys else {}
    request = urllib.request.Request(f"http://{host}:{server.port}/ready", headers=headers)
    try:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback
        with direct.open(request, timeout=3) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as exc:  # 503 while loading: its body says what loads
        try:
            body = json.load(exc)
        except ValueError:
            return None
    except (OSError, ValueError):
        return None
    for provider in body.get("providers") or ():
        if provider.get("name") == name:
            return list((provider.get("state") or {}).get("workers") or ())
    return []


def _ready_worker(workers: list[dict[str, Any]] | None, model: str) -> tuple[str | None, str]:
    """A ready worker's URL for `model`, or None and why there is none."""
    if workers is None:
        return None, "no gateway answers at this config's address: start it (llms-gateway serve)"
    mine = [w for w in workers if model in (w.get("models") or ()) or not w.get("spawned")]
    ready = [w for w in mine if w.get("state") == "ready"]
    if ready:
        return str(ready[0]["url"]), "ready"
    states = ", ".join(f"{w.get('name')} {w.get('state')}" for w in mine) or "no worker"
    return None, f"not ready in the running gateway ({states})"


def _check(args: argparse.Namespace) -> int:
    _, snapshot = _load(args.config)
    specs = [p for p in snapshot.providers if args.provider in (None, p.name)]
    if not specs:
        print(f"no provider named {args.provider!r}", file=sys.stderr)
        return 2
    return asyncio.run(_check_all(snapshot, [s.name for s in specs]))


async def _check_all(snapshot: Snapshot, names: list[str]) -> int:
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
            workers = _running_pool(snapshot, spec.name) if spec.kind == "pool" else None
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


def _chat(args: argparse.Namespace) -> int:
    conversation = cli_chat.Conversation(args.model, args.system, args.max_tokens,
                                         args.temperature)
    return cli_chat.run(args.url.rstrip("/"), args.key, conversation, args.prompt)


def _usage(args: argparse.Namespace) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    root = args.url.rstrip("/").removesuffix("/v1")
    try:
        text = asyncio.run(_get_text(f"{root}/metrics"))
    except GatewayError as exc:
        print(f"llms-gateway: cannot read {root}/metrics: {exc.message}", file=sys.stderr)
        return 1
    totals: dict[tuple[str, str], dict[str, float]] = {}
    wanted = {"llms_requests_total": "requests", "llms_tokens_total": None,
              "llms_cost_usd_total": "cost"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in wanted or sample.labels.get("provider") in (None, "none"):
                continue
            column = wanted[sample.name] or f"{sample.labels['kind']}_tokens"
            row = totals.setdefault((sample.labels["provider"], sample.labels["model"]), {})
            row[column] = row.get(column, 0.0) + sample.value
    columns = ("requests", "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost")
    print(f"{'provider':<14} {'model':<24} " + " ".join(f"{c:>17}" for c in columns))
    for (provider, model), row in sorted(totals.items()):
        cells = [f"{row.get(c, 0):17.6f}" if c == "cost" else f"{row.get(c, 0):17.0f}"
                 for c in columns]
        print(f"{provider:<14} {model:<24} " + " ".join(cells))
    grand = sum(row.get("cost", 0.0) for row in totals.values())
    print(f"total cost: ${grand:.6f} since the gateway started")
    return 0


async def _get_text(url: str) -> str:
    """The body of a 200 answer to GET `url`; a GatewayError for anything else."""
    async with AiohttpTransport() as transport:
        response = await transport.request("GET", url, headers={}, link=cli_chat.link_to(url))
        try:
            body = await response.read()
        finally:
            response.close()
    if response.status != 200:
        raise ProviderUnavailable(f"HTTP {response.status}")
    return body.decode("utf-8", "replace")


if __name__ == "__main__":
    sys.exit(main())
