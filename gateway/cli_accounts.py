"""`llms-gateway keys | teams | spend`: the running gateway's admin API from a shell.

Each command is one or two calls to `/admin/keys`, `/admin/teams` or `/admin/spend` over HTTP
(the database belongs to the gateway: the command never opens it). The gateway is found where
the config says it listens (as `ls` finds it) unless `--url` says otherwise; the admin key is
`--admin-key`, else `$LLMS_ADMIN_KEY`, else the config's first admin key, else none (with no
admin key configured the admin routes answer this machine without one). An error answer's
message is printed and the command exits 1; an option that cannot be read is a usage error (2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from gateway.cli_admin import ADMIN_KEY_ENV, AdminError, Target, target
from gateway.cli_tables import key_rows, spend_csv, spend_rows, team_rows

PERIODS = ("day", "week", "month", "total")
GROUPS = ("key", "team", "alias", "provider", "model", "day")
CLEAR = "none"  # `keys update ID --budget none`: the field is cleared (sent as null)


# --- options, read by small pure functions --------------------------------------------------


def parse_budget(text: str) -> dict[str, Any]:
    """`20/month`, `5/day`, `3/week`, `100/total`, `$20/month`, or a bare number (a month) as
    the admin API's budget; ValueError saying what is wrong."""
    amount, _, period = text.strip().partition("/")
    period = period.strip().lower() or "month"
    if period not in PERIODS:
        raise ValueError(f"the period must be one of {', '.join(PERIODS)}, got {period!r} "
                         "(e.g. 20/month)")
    try:
        usd = float(amount.strip().removeprefix("$"))
    except ValueError:
        raise ValueError(f"the amount must be dollars, got {amount.strip()!r} "
                         "(e.g. 20/month)") from None
    if not math.isfinite(usd) or usd < 0:
        raise ValueError(f"the amount must be zero or more dollars, got {amount.strip()!r}")
    return {"usd": usd, "period": period}


def parse_expiry(text: str) -> str:
    """A date (its midnight, UTC) or a date-time (UTC unless it says its zone) as ISO 8601
    with its offset; ValueError for anything else."""
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected a date or date-time like 2026-12-31 or "
                         f"2026-12-31T18:00:00Z, got {text!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).isoformat()


def parse_models(text: str) -> list[str]:
    """`a,b` as a list of aliases (blanks dropped); ValueError if none is left."""
    models = [alias.strip() for alias in text.split(",") if alias.strip()]
    if not models:
        raise ValueError("expected aliases separated by commas, like gpt-4o,claude")
    return models


def parse_guardrails(text: str) -> list[str]:
    """`a,b` as a list of guardrail names (blanks dropped); ValueError if none is left."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("expected guardrail names separated by commas, like pii,no-secrets")
    return names


def parse_tools(text: str) -> list[str]:
    """`docs_*,search_web` as MCP tool names or patterns; an empty text allows none."""
    return [name.strip() for name in text.split(",") if name.strip()]


def parse_count(text: str) -> int:
    """A positive whole number."""
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"expected a whole number of 1 or more, got {text!r}")
    return int(text)


def parse_capture(text: str) -> dict[str, str]:
    """`metadata` or `bodies` as a key's `logs` (what the request log keeps of its requests)."""
    if text not in ("metadata", "bodies"):
        raise ValueError("metadata or bodies (none: the alias's or the default)")
    return {"capture": text}


def parse_pair(text: str) -> tuple[str, str]:
    """`k=v` as a metadata entry."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected key=value, got {text!r}")
    return key.strip(), value


def _option(parse: Callable[[str], Any], clearable: bool) -> Callable[[str], Any]:
    """`parse` as an argparse type: its ValueError becomes a usage error naming the option;
    with `clearable`, `none` stands for null (the field is cleared)."""
    def typed(text: str) -> Any:
        if clearable and text.strip().lower() == CLEAR:
            return None
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    typed.__name__ = parse.__name__.removeprefix("parse_")  # what argparse names in errors
    return typed


# --- what each command prints -------------------------------------------------------------


# --- the commands ------------------------------------------------------------------------------

# Options a key and a team share: (flags, destination in the API's body, how it is read, help).
LIMITS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--models", "models", parse_models, "aliases it may use, comma-separated (default: any)"),
    ("--mcp-tools", "mcp_tools", parse_tools, "MCP tools it may call, names or patterns "
                                              "like docs_*, comma-separated; '' for none "
                                              "(default: any)"),
    ("--budget", "budget", parse_budget, "dollars per period: 20/month, 5/day, 3/week, "
                                         "100/total; a bare number is per month"),
    ("--rpm", "rpm", parse_count, "requests per minute"),
    ("--tpm", "tpm", parse_count, "tokens per minute"),
    ("--max-parallel", "max_parallel", parse_count, "requests in flight at once"),
    ("--guardrails", "guardrails", parse_guardrails,
     "guardrails of llms.json its requests pass, comma-separated, beside their alias's"),
)


def _add_connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="the gateway's config (where it listens, its admin "
                                         "keys)")
    parser.add_argument("--url", help="the running gateway (default: the config's server.host "
                                      "and server.port)")
    parser.add_argument("--admin-key", help=f"an admin key (default: ${ADMIN_KEY_ENV}, else "
                                            "the config's first server.admin_keys)")


def _add_fields(parser: argparse.ArgumentParser, update: bool, key: bool) -> None:
    """The options of a key or team; on update, left out is kept and `none` clears."""
    more = " (none: clear it)" if update else ""
    if key:
        parser.add_argument("--team", type=_option(str, update), default=argparse.SUPPRESS,
                            help="the team it belongs to" + more)
    for flags, dest, parse, help_text in LIMITS:
        parser.add_argument(flags, dest=dest, type=_option(parse, update),
                            default=argparse.SUPPRESS, help=help_text + more)
    if key:
        parser.add_argument("--expires", dest="expires_at", type=_option(parse_expiry, update),
                            default=argparse.SUPPRESS, metavar="WHEN",
                            help="a date (its midnight UTC) or date-time it stops working" + more)
        parser.add_argument("--log-capture", dest="logs", type=_option(parse_capture, update),
                            default=argparse.SUPPRESS, metavar="WHAT",
                            help="what the request log keeps of its requests: metadata or "
                                 "bodies" + more)
    parser.add_argument("--force", action="store_true",
                        help="keep aliases the gateway does not serve, or an expiry past")
    parser.add_argument("--metadata", type=_option(parse_pair, False), nargs="+",
                        action="extend", default=argparse.SUPPRESS, metavar="K=V",
                        help="labels kept with it" + (" (replace all of them)" if update
                                                      else ""))


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    """The body fields the options set (SUPPRESS: an option not given is absent)."""
    names = ("team", "models", "guardrails", "mcp_tools", "budget", "rpm", "tpm",
             "max_parallel", "expires_at", "logs")
    body = {name: getattr(args, name) for name in names if hasattr(args, name)}
    if hasattr(args, "metadata"):
        body["metadata"] = dict(args.metadata)
    return body


def checked(args: argparse.Namespace, gateway: Target, body: dict[str, Any]
            ) -> dict[str, Any]:
    """`body`, or AdminError for what no request could use: an expiry already past, aliases
    the running gateway does not serve (unless `--force`)."""
    if args.force:
        return body
    problems = []
    expires = body.get("expires_at")
    if expires and dt.datetime.fromisoformat(expires) <= dt.datetime.now(dt.UTC):
        problems.append(f"--expires: {expires} has passed: the key would be refused from the "
                        "start")
    unknown = [alias for alias in body.get("models") or () if not _served(gateway, alias)]
    if unknown:
        problems.append(f"--models: no provider of the gateway at {gateway.root} serves "
                        f"{', '.join(unknown)} (llms-gateway ls lists what it serves)")
    if problems:
        raise AdminError("; ".join(problems) + "; --force makes it anyway")
    return body


def _served(gateway: Target, alias: str) -> bool:
    """Whether the gateway serves `alias` (an alias, a name for one or a pattern's match);
    True when it cannot say (the check is a courtesy, the admin API decides)."""
    try:
        gateway.call("GET", f"/v1/models/{urllib.parse.quote(alias, safe='')}")
    except AdminError as exc:
        return "answered 404" not in str(exc)
    return True


def add_commands(commands: Any) -> None:
    """Add `keys`, `teams` and `spend` to the `llms-gateway` command."""
    keys = commands.add_parser("keys", help="create, list, update and revoke virtual keys")
    actions = keys.add_subparsers(required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new key; its secret is printed once")
    create.add_argument("--name", required=True, help="who or what holds it")
    _add_fields(create, update=False, key=True)
    listed = actions.add_parser("list", help="every key (never a secret)")
    listed.add_argument("--team", help="only this team's keys")
    revoke = actions.add_parser("revoke", help="refuse a key from now on")
    revoke.add_argument("id")
    update = actions.add_parser("update", help="change a key's team, models, limits, budget, "
                                               "expiry or metadata")
    update.add_argument("id")
    update.add_argument("--name", default=argparse.SUPPRESS)
    _add_fields(update, update=True, key=True)
    reopen = actions.add_parser("reopen", help="revoke every key and serve without keys again "
                                               "(a gateway on this machine only)")
    for parser, run in ((create, _key_create), (listed, _key_list), (revoke, _key_revoke),
                        (update, _key_update), (reopen, _key_reopen)):
        _add_connection(parser)
        parser.set_defaults(run=run)

    teams = commands.add_parser("teams", help="create, list, update and delete teams")
    actions = teams.add_subparsers(required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new team")
    create.add_argument("name")
    _add_fields(create, update=False, key=False)
    listed = actions.add_parser("list", help="every team")
    update = actions.add_parser("update", help="change a team's models, limits, budget or "
                                               "metadata")
    update.add_argument("name")
    _add_fields(update, update=True, key=False)
    delete = actions.add_parser("delete", help="delete a team that has no live key")
    delete.add_argument("name")
    for parser, run in ((create, _team_create), (listed, _team_list), (update, _team_update),
                        (delete, _team_delete)):
        _add_connection(parser)
        parser.set_defaults(run=run)

    spend = commands.add_parser("spend", help="requests, tokens and dollars from the spend "
                                              "database, grouped")
    spend.add_argument("--group-by", choices=GROUPS, default="key")
    spend.add_argument("--start", help="from this date or date-time (ISO 8601, UTC)")
    spend.add_argument("--end", help="until this date or date-time, excluded")
    spend.add_argument("--csv", action="store_true", help="CSV with a header row")
    _add_connection(spend)
    spend.set_defaults(run=_spend)


def _warned(answer: dict[str, Any]) -> dict[str, Any]:
    """The admin API's answer, its warnings (what `--force` kept) printed to stderr."""
    for warning in answer.get("warnings") or ():
        print(f"llms-gateway: warning: {warning}", file=sys.stderr)
    return answer


def _reported(command: Callable[[argparse.Namespace, Target], None]
              ) -> Callable[[argparse.Namespace], int]:
    """A command that prints the gateway's refusal and exits 1 instead of a traceback."""
    def run(args: argparse.Namespace) -> int:
        try:
            command(args, target(args))
        except AdminError as exc:
            print(f"llms-gateway: {exc}", file=sys.stderr)
            return 1
        return 0
    return run


@_reported
def _key_create(args: argparse.Namespace, gateway: Target) -> None:
    made = _warned(gateway.call("POST", "/admin/keys", checked(
        args, gateway, {"name": args.name, **_fields(args)})))
    team = f", team {made['team']}" if made.get("team") else ""
    print(f"Created key {made['id']} ({made['name']}{team}). Its secret is shown this once, "
          "only its hash is kept: store it now.")
    print()
    print(f"    {made['key']}")
    print()


@_reported
def _key_list(args: argparse.Namespace, gateway: Target) -> None:
    query = {"team": args.team} if args.team else None
    for line in key_rows(gateway.call("GET", "/admin/keys", query=query)["data"]):
        print(line)


@_reported
def _key_revoke(args: argparse.Namespace, gateway: Target) -> None:
    done = gateway.call("DELETE", f"/admin/keys/{urllib.parse.quote(args.id, safe='')}")
    print(f"Revoked key {done['id']} ({done['name']}): it is refused from now on.")


@_reported
def _key_reopen(args: argparse.Namespace, gateway: Target) -> None:
    done = gateway.call("POST", "/admin/reopen")
    print(f"Revoked {done['revoked']} key(s): the gateway serves without a key again, as its "
          "llms.json says (audited as gateway_reopened).")


@_reported
def _key_update(args: argparse.Namespace, gateway: Target) -> None:
    body = _fields(args)
    if hasattr(args, "name"):
        body["name"] = args.name
    done = _warned(gateway.call("PATCH", f"/admin/keys/{urllib.parse.quote(args.id, safe='')}",
                                checked(args, gateway, body)))
    for line in key_rows([done]):
        print(line)


@_reported
def _team_create(args: argparse.Namespace, gateway: Target) -> None:
    made = _warned(gateway.call("POST", "/admin/teams", checked(
        args, gateway, {"name": args.name, **_fields(args)})))
    for line in team_rows([made]):
        print(line)


@_reported
def _team_list(args: argparse.Namespace, gateway: Target) -> None:
    for line in team_rows(gateway.call("GET", "/admin/teams")["data"]):
        print(line)


@_reported
def _team_update(args: argparse.Namespace, gateway: Target) -> None:
    done = _warned(gateway.call("PATCH", f"/admin/teams/{urllib.parse.quote(args.name, safe='')}",
                                checked(args, gateway, _fields(args))))
    for line in team_rows([done]):
        print(line)


@_reported
def _team_delete(args: argparse.Namespace, gateway: Target) -> None:
    gateway.call("DELETE", f"/admin/teams/{urllib.parse.quote(args.name, safe='')}")
    print(f"Deleted team {args.name}.")


@_reported
def _spend(args: argparse.Namespace, gateway: Target) -> None:
    query = {"group_by": args.group_by}
    query.update({k: v for k, v in (("start", args.start), ("end", args.end)) if v})
    rows = gateway.call("GET", "/admin/spend", query=query)["data"]
    if args.csv:
        spend_csv(rows, sys.stdout)
        return
    for line in spend_rows(rows, args.group_by):
        print(line)
