"""An operator hands out keys from a shell: `llms-gateway keys | teams | spend` against the
running gateway (found through its llms.json, as `ls` finds it), a client spends the key with
the OpenAI SDK, and the spend it prints is the admin API's."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.cli_accounts import parse_budget
from tests.gateway_process import GatewayProcess
from tests.test_cli import run
from tests.test_teams import MESSAGES, Admin, priced
from tests.upstream import FakeUpstream

ADMIN_KEY = "admin-cli-secret-1"


@pytest.mark.parametrize(("text", "budget"), [
    ("20/month", {"usd": 20.0, "period": "month"}),
    ("5/day", {"usd": 5.0, "period": "day"}),
    ("3/week", {"usd": 3.0, "period": "week"}),
    ("100/total", {"usd": 100.0, "period": "total"}),
    ("12.5", {"usd": 12.5, "period": "month"}),
    ("$0.01/Day", {"usd": 0.01, "period": "day"}),
    (" 0 / total ", {"usd": 0.0, "period": "total"}),
])
def test_a_budget_is_dollars_per_period_and_a_bare_number_is_per_month(
        text: str, budget: dict[str, Any]) -> None:
    assert parse_budget(text) == budget


@pytest.mark.parametrize(("text", "said"), [
    ("20/fortnight", "period"), ("twenty/month", "amount"), ("-5/day", "zero or more"),
    ("nan/day", "zero or more"), ("inf", "zero or more"), ("/month", "amount"), ("", "amount"),
])
def test_a_budget_that_cannot_be_read_says_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        parse_budget(text)


def test_a_wrong_option_is_a_usage_error_naming_it_before_any_gateway_is_asked() -> None:
    result = run("keys", "create", "--name", "x", "--budget", "20/fortnight", "--url",
                 "http://127.0.0.1:9")
    assert result.returncode == 2
    assert "argument --budget" in result.stderr and "fortnight" in result.stderr
    result = run("keys", "update", "key_x", "--rpm", "0", "--url", "http://127.0.0.1:9")
    assert result.returncode == 2 and "argument --rpm" in result.stderr


@pytest.fixture
def gateway(start_gateway: Callable[..., GatewayProcess],
            upstream_factory: Callable[[str], FakeUpstream]) -> GatewayProcess:
    """A priced gateway with an admin key, its llms.json saying where it listens."""
    doc = priced(upstream_factory("billing"), "m", "other",
                 server={"admin_keys": [ADMIN_KEY]})
    started = start_gateway(doc)
    doc["server"]["port"] = started.port  # the CLI finds the gateway where its config says
    started.write_config(doc)
    return started


def cli(gateway: GatewayProcess, *args: str, **env: str) -> str:
    result = run(*args, "--config", str(gateway.config_path), env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_key_made_on_the_command_line_is_used_listed_charged_and_revoked(
        gateway: GatewayProcess) -> None:
    cli(gateway, "teams", "create", "research", "--budget", "50/month")
    made = cli(gateway, "keys", "create", "--name", "alice-laptop", "--team", "research",
               "--models", "m,other", "--budget", "5/day", "--rpm", "100",
               "--expires", "2099-12-31", "--metadata", "owner=alice", "desk=3")
    secret = re.findall(r"sk-llms-[\w-]+", made)
    key_id = re.findall(r"key_[0-9a-f]+", made)
    assert len(secret) == 1 and key_id, made
    assert "shown this once" in made

    client = openai.OpenAI(base_url=gateway.base_url, api_key=secret[0], max_retries=0)
    costs = []
    for model in ("m", "m", "other"):
        reply = client.chat.completions.with_raw_response.create(model=model,
                                                                  messages=MESSAGES)
        assert reply.parse().choices[0].message.content
        costs.append(float(reply.headers["x-llms-cost"]))

    listed = cli(gateway, "keys", "list")
    assert secret[0] not in listed, "the secret is never printed again"
    header, row = listed.splitlines()[0].split(), listed.splitlines()[1]
    assert header == ["id", "name", "key", "team", "models", "budget", "expires", "revoked"]
    assert row.split() == [key_id[0], "alice-laptop", f"{secret[0][:12]}...{secret[0][-4:]}",
                           "research", "m,other", "$5/day", "2099-12-31", "00:00", "no"]
    assert cli(gateway, "keys", "list", "--team", "nobody").splitlines()[1:] == []
    shown = Admin(gateway, ADMIN_KEY).call("GET", f"/admin/keys/{key_id[0]}").json()
    assert shown["metadata"] == {"owner": "alice", "desk": "3"} and shown["rpm"] == 100

    api = Admin(gateway, ADMIN_KEY).spend("key")
    table = cli(gateway, "spend")
    line = next(line for line in table.splitlines() if line.startswith(key_id[0])).split()
    assert line[1:] == [str(api[key_id[0]]["requests"]), str(api[key_id[0]]["refused"]),
                        str(api[key_id[0]]["prompt_tokens"]),
                        str(api[key_id[0]]["completion_tokens"]),
                        str(api[key_id[0]]["cached_tokens"]), f"{sum(costs):.6f}"]
    by_model = Admin(gateway, ADMIN_KEY).call("GET", "/admin/spend?group_by=model").json()
    printed = list(csv.DictReader(io.StringIO(cli(gateway, "spend", "--group-by", "model",
                                                  "--csv"))))
    assert printed == [{column: str(value) for column, value in row.items()}
                       for row in by_model["data"]]
    assert sum(float(r["cost"]) for r in printed) == pytest.approx(sum(costs), abs=1e-9)
    later = cli(gateway, "spend", "--start", "2099-01-01")
    assert key_id[0] not in later and "total: $0.000000 over 0 requests" in later

    assert "Revoked" in cli(gateway, "keys", "revoke", key_id[0])
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert re.search(rf"^{key_id[0]} .* \d\d:\d\d$", cli(gateway, "keys", "list"), re.M)


def test_keys_and_teams_are_updated_and_a_refusal_is_printed_with_a_nonzero_exit(
        gateway: GatewayProcess) -> None:
    cli(gateway, "teams", "create", "ops", "--models", "m")
    assert cli(gateway, "teams", "update", "ops", "--budget", "2", "--rpm", "60"
               ).splitlines()[1].split() == ["ops", "m", "$2/month", "60", "-", "-"]
    key_id = re.findall(r"key_[0-9a-f]+", cli(gateway, "keys", "create", "--name", "bob",
                                               "--budget", "1/week"))[0]
    updated = cli(gateway, "keys", "update", key_id, "--team", "ops", "--budget", "none")
    assert updated.splitlines()[1].split()[3:6] == ["ops", "*", "-"]
    assert "ops" in cli(gateway, "teams", "list")

    busy = run("teams", "delete", "ops", "--config", str(gateway.config_path))
    assert busy.returncode == 1 and "still has 1 key" in busy.stderr
    wrong = run("keys", "list", "--config", str(gateway.config_path),
                env={"LLMS_ADMIN_KEY": "not-an-admin-key"})
    assert wrong.returncode == 1 and "401" in wrong.stderr and "Invalid API key" in wrong.stderr
    assert "not-an-admin-key" not in wrong.stderr
    missing = run("keys", "revoke", "key_nobody", "--url", gateway.url,
                  "--admin-key", ADMIN_KEY)
    assert missing.returncode == 1 and "No live key with id 'key_nobody'" in missing.stderr
    cli(gateway, "keys", "revoke", key_id)
    assert cli(gateway, "teams", "delete", "ops").strip() == "Deleted team ops."
    nowhere = run("spend", "--url", "http://127.0.0.1:9", "--admin-key", ADMIN_KEY)
    assert nowhere.returncode == 1 and "no gateway answering" in nowhere.stderr
    assert httpx.get(f"{gateway.url}/health").status_code == 200


def test_aliases_nobody_serves_and_a_past_expiry_are_refused_unless_forced(
        gateway: GatewayProcess) -> None:
    typo = run("keys", "create", "--name", "carol", "--models", "m,gpt-4o,claude",
               "--config", str(gateway.config_path))
    team = run("teams", "create", "late", "--models", "m", "--config", str(gateway.config_path))
    expired = run("keys", "create", "--name", "dave", "--expires", "2020-01-01",
                  "--config", str(gateway.config_path))

    assert typo.returncode == 1 and "--models" in typo.stderr
    assert "gpt-4o, claude" in typo.stderr and "--force" in typo.stderr
    assert team.returncode == 0, team.stderr
    assert expired.returncode == 1 and "--expires: 2020-01-01" in expired.stderr
    assert "carol" not in cli(gateway, "keys", "list"), "nothing was made"
    forced = run("keys", "create", "--name", "carol", "--models", "m,gpt-4o", "--force",
                 "--config", str(gateway.config_path))
    assert forced.returncode == 0 and re.findall(r"key_[0-9a-f]+", forced.stdout)
    assert "warning: models: no provider serves gpt-4o" in forced.stderr


def test_the_admin_api_keeps_what_it_is_sent_and_warns_of_what_no_request_could_use(
        gateway: GatewayProcess) -> None:
    admin = Admin(gateway, ADMIN_KEY)
    made = admin.call("POST", "/admin/keys", json={
        "name": "erin", "models": ["m", "claude"], "expires_at": "2020-01-01T00:00:00Z"})
    team = admin.call("POST", "/admin/teams", json={"name": "fine", "models": ["m", "other"]})

    assert made.status_code == 201
    assert made.json()["warnings"] == ["models: no provider serves claude",
                                       "expires_at: already past: the key is refused from the "
                                       "start"]
    assert team.status_code == 201 and "warnings" not in team.json()
