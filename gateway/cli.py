"""`llms-gateway`: serve, ls, check, chat."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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

from gateway.edge import openfiles
from gateway.state import config
from gateway.state.config import (
    BIND_ENV,
    CONFIG_ENV,
    OPEN_ENV,
    ConfigError,
    Snapshot,
    is_loopback,
    model_facts,
)
from gateway.state.facts import Facts
from providers.contract.errors import GatewayError, ProviderUnavailable
from providers.contract.transport import HttpResponse, Link, ProxyEnvironment
from providers.transport import AiohttpTransport
from providers.wire import sse

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llms-gateway", description=__doc__)
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

    ls = commands.add_parser("ls", help="list providers in order and the models each serves")
    ls.add_argument("--config")
    ls.set_defaults(run=_ls)

    check = commands.add_parser("check", help="send a tiny request to each enabled provider")
    check.add_argument("provider", nargs="?", help="only this provider")
    check.add_argument("--config")
    check.set_defaults(run=_check)

    chat = commands.add_parser("chat", help="stream an answer through a running gateway")
    chat.add_argument("-m", "--model", required=True)
    chat.add_argument("prompt")
    chat.add_argument("--url", default=os.environ.get("LLMS_GATEWAY_URL", DEFAULT_URL))
    chat.add_argument("--key", default=os.environ.get("LLMS_GATEWAY_KEY"))
    chat.set_defaults(run=_chat)

    usage = commands.add_parser("usage", help="requests, tokens and cost per provider and model "
                                              "from a running gateway")
    usage.add_argument("--url", default=os.environ.get("LLMS_GATEWAY_URL", DEFAULT_URL))
    usage.set_defaults(run=_usage)
    return parser


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
    open_files = openfiles.raise_limit()
    # Half: the default max_concurrency is a safety valve, not a sizing, and a hard limit of
    # 20,000 (carrying ~9,900) is not worth a warning at every start; 4,096 (~1,900) is.
    if (carried := openfiles.requests_within(open_files)) < snapshot.server.max_concurrency / 2:
        print(f"llms-gateway: the open-file limit ({open_files}) carries about {carried} "
              f"requests at once, fewer than server.max_concurrency "
              f"({snapshot.server.max_concurrency}): past it, connections fail with 'Too many "
              f"open files'. Raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker "
              f"--ulimit nofile=) or lower max_concurrency.", file=sys.stderr)
    print(f"llms-gateway: serving http://{host}:{port}/v1 with {path}", file=sys.stderr)
    serving.run(snapshot.server, host, port, args.workers, open_files)
    return 0


def _ls(args: argparse.Namespace) -> int:
    path, snapshot = _load(args.config)
    live = _live_providers(snapshot)
    print(f"{path} ({len(snapshot.providers)} providers, tried in this order)")
    facts = model_facts(snapshot)
    for number, spec in enumerate(snapshot.providers, 1):
        state = "enabled" if spec.enabled else f"disabled: {spec.disabled_reason}"
        print(f"{number:>3}. {spec.name:<14} {spec.kind:<10} {state}")
        for alias, model in spec.models.items():
            target = f" -> {model.id}" if model.id != alias else ""
            known = facts[(spec.name, alias)]
            print(f"       {alias}{target}{facts_text(known)}")
        for worker in (((live or {}).get(spec.name) or {}).get("state") or {}).get("workers") or ():
            print("       " + worker_line(worker))
    names = [*snapshot.names.exact.items(), *snapshot.names.patterns]
    if names:
        print("names served as another alias (models.*.alias_of):")
    for name, alias in names:
        print(f"       {name} -> {alias}")
    if live is None:
        print("(no gateway answering at server.host:server.port: worker states not shown)")
    return 0


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
    """One pool worker as `ls` prints it: name, state and for how long, where, load."""
    line = (f"worker {worker['name']:<12} {worker['state']:<9} {worker['for_s']:>7}s  "
            f"{worker['url']}  inflight {worker['inflight']}  restarts {worker['restarts']}")
    return line + (f"  ({worker['last_error']})" if worker.get("last_error") else "")


def _live_providers(snapshot: Snapshot) -> dict[str, dict[str, Any]] | None:
    """The running gateway's /ready view of each provider, if one answers on the config's port."""
    import urllib.request

    host = "127.0.0.1" if snapshot.server.host in ("0.0.0.0", "::") else snapshot.server.host
    keys = snapshot.admin_keys + snapshot.keys  # /ready lists providers only to a key
    headers = {"Authorization": f"Bearer {keys[0].secret.reveal()}"} if keys else {}
    request = urllib.request.Request(f"http://{host}:{snapshot.server.port}/ready",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=1) as response:
            body = msgspec.json.decode(response.read())
    except OSError as exc:  # 503 (no provider enabled) still carries the listing
        body = _http_error_body(exc)
        if body is None:
            return None
    return {p["name"]: p for p in body.get("providers") or ()}


def _http_error_body(exc: OSError) -> dict[str, Any] | None:
    import urllib.error

    if isinstance(exc, urllib.error.HTTPError):
        try:
            decoded: dict[str, Any] = msgspec.json.decode(exc.read())
            return decoded
        except msgspec.DecodeError:
            return None
    return None


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
    from gateway.state.runtime import build
    from gateway.stores.responses import ResponseStore
    from providers.contract.provider import Outgoing, Provider

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
                    outcome = f"error: {exc.status} {exc.message}"
                elapsed = (time.perf_counter() - started) * 1000
                print(live.redactor.text(
                    f"{spec.name:<14} {alias:<28} {elapsed:8.0f} ms  {outcome}"))
    return 1 if failures else 0


def _chat(args: argparse.Namespace) -> int:
    return asyncio.run(_stream_chat(args.url.rstrip("/"), args.key, args.model, args.prompt))


async def _stream_chat(url: str, key: str | None, model: str, prompt: str) -> int:
    # Through the same transport as the gateway's own upstream calls: one HTTP client in the
    # project, and HTTPS_PROXY / NO_PROXY honoured as curl would for a remote gateway.
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    try:
        async with AiohttpTransport() as transport:
            response = await transport.request(
                "POST", f"{url}/chat/completions", headers=headers,
                body=msgspec.json.encode(body), link=_link_to(url), compressed=False)
            try:
                if response.status != 200:
                    print(_error_text(await response.read()), file=sys.stderr)
                    return 1
                return await _print_stream(response)
            finally:
                response.close()
    except GatewayError as exc:
        print(f"llms-gateway: cannot reach {url}: {exc.message}", file=sys.stderr)
        return 1


async def _print_stream(response: HttpResponse) -> int:
    """Write each content delta of an SSE chat stream as it arrives; 1 on an in-band error."""
    reader = sse.Reader()
    while chunk := await response.readany():
        for event in reader.feed(chunk):
            if (ended := _print_event(event)) is not None:
                return ended
    for event in reader.flush():
        if (ended := _print_event(event)) is not None:
            return ended
    sys.stdout.write("\n")
    return 0


def _print_event(event: sse.Event) -> int | None:
    """Write one event's content; the exit status once the stream is over (`[DONE]`, error)."""
    if event.done:
        sys.stdout.write("\n")
        return 0
    said = msgspec.json.decode(event.data)
    if "error" in said:
        print(f"\nerror: {said['error'].get('message')}", file=sys.stderr)
        return 1
    for choice in said.get("choices") or ():
        sys.stdout.write((choice.get("delta") or {}).get("content") or "")
    sys.stdout.flush()
    return None


def _link_to(url: str) -> Link:
    """How the CLI reaches the gateway at `url`: the environment's proxy unless NO_PROXY."""
    return Link(proxy=ProxyEnvironment.read(os.environ).proxy_for(url))


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
        response = await transport.request("GET", url, headers={}, link=_link_to(url))
        try:
            body = await response.read()
        finally:
            response.close()
    if response.status != 200:
        raise ProviderUnavailable(f"HTTP {response.status}")
    return body.decode("utf-8", "replace")


def _error_text(body: bytes) -> str:
    try:
        error = msgspec.json.decode(body)["error"]
        return f"error: {error.get('code')}: {error.get('message')}"
    except (msgspec.DecodeError, KeyError, TypeError):
        return f"error: {body[:500].decode('utf-8', 'replace')}"


if __name__ == "__main__":
    sys.exit(main())
