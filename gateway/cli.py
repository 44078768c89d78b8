"""`llms-gateway`: serve, ls, check, chat, usage, keys, teams, spend."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gateway import cli_accounts, cli_chat, cli_check, cli_ls, config
from gateway.cli_check import KEY_ENV
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
from providers.contract.errors import GatewayError, ProviderUnavailable
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
    _key_option(ls)
    ls.set_defaults(run=_ls)

    check = commands.add_parser("check", help="send a tiny request to each enabled provider")
    check.add_argument("provider", nargs="?", help="only this provider")
    check.add_argument("--config")
    _key_option(check)
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
    chat.add_argument("--key", default=os.environ.get(KEY_ENV))
    chat.set_defaults(run=_chat)

    usage = commands.add_parser("usage", help="requests, tokens and cost per provider and model "
                                              "from a running gateway")
    usage.add_argument("--url", default=os.environ.get("LLMS_GATEWAY_URL", DEFAULT_URL))
    _key_option(usage)
    usage.set_defaults(run=_usage)

    cli_accounts.add_commands(commands)  # keys, teams, spend: the admin API of a running gateway
    return parser


def _key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", default=os.environ.get(KEY_ENV),
                        help=f"the key the running gateway asks for (default: ${KEY_ENV}, else "
                             "the config's first admin or client key)")


def _key(args: argparse.Namespace, snapshot: Snapshot | None) -> str | None:
    """The key a command sends the running gateway: `--key` (or its variable), else one the
    config names."""
    if args.key:
        return str(args.key)
    keys = (snapshot.admin_keys + snapshot.keys) if snapshot is not None else ()
    return keys[0].secret.reveal() if keys else None


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


def _check(args: argparse.Namespace) -> int:
    _, snapshot = _load(args.config)
    return cli_check.check(snapshot, args.provider, _key(args, snapshot))


def _ls(args: argparse.Namespace) -> int:
    path, snapshot = _load(args.config)
    root = (args.url or cli_ls.local_url(snapshot)).rstrip("/").removesuffix("/v1")
    live, why = cli_ls.live_status(root, _key(args, snapshot), direct=args.url is None)
    print(f"{path} ({len(snapshot.providers)} providers, tried in this order)")
    print(f"its state in {state_dir(os.environ, path)}")
    for line in cli_ls.lines(snapshot, live, model_facts(snapshot)):
        print(line)
    if live is None:
        print(f"({why}: this is the config's view; admin switches, open circuits, discovered "
              f"models and pool workers show while it runs)")
    return 0


def _chat(args: argparse.Namespace) -> int:
    conversation = cli_chat.Conversation(args.model, args.system, args.max_tokens,
                                         args.temperature)
    return cli_chat.run(args.url.rstrip("/"), args.key, conversation, args.prompt)


def _usage(args: argparse.Namespace) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    root = args.url.rstrip("/").removesuffix("/v1")
    try:
        text = asyncio.run(_get_text(f"{root}/metrics", args.key))
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


async def _get_text(url: str, key: str | None) -> str:
    """The body of a 200 answer to GET `url`, sent `key`; a GatewayError for anything else."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with AiohttpTransport() as transport:
        response = await transport.request("GET", url, headers=headers,
                                           link=cli_chat.link_to(url))
        try:
            body = await response.read()
        finally:
            response.close()
    if response.status in (401, 403):
        raise ProviderUnavailable(f"HTTP {response.status}: pass its key (--key or ${KEY_ENV})")
    if response.status != 200:
        raise ProviderUnavailable(f"HTTP {response.status}")
    return body.decode("utf-8", "replace")


if __name__ == "__main__":
    sys.exit(main())
