"""People sign in to the console through their company's identity provider (OpenID Connect):
an admin lands on the overview and their changes are audited in their name, a viewer reads and
changes nothing, a team admin sees their team alone; a forged `state`, a token for another
audience, an expired one and a bad signature each get a 401 page and no session; a rotated
signing key is picked up; a sign-out holds on every gateway sharing the database."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import config as gateway_config
from gateway.console.roles import actor_of, role_of
from gateway.core.settings import ConfigError
from gateway.core.settings.console import OidcRoles
from tests import browser
from tests.fake_oidc import CLIENT_ID, CLIENT_SECRET, FakeIssuer
from tests.gateway_process import GatewayProcess
from tests.test_console import CHROMIUM, KEY, keyed, picture, shoot, show
from tests.test_teams import Admin
from tests.test_teams import chat as teams_chat
from tests.upstream import FakeUpstream

ROLES = {"claim": "groups", "admin": ["llms-admins"], "viewer": ["llms-viewers"],
         "team_admin": {"red-admins": "red"}}
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    with FakeIssuer() as running:
        yield running


def sso(upstream: FakeUpstream, issuer: FakeIssuer, **database: Any) -> dict[str, Any]:
    doc = keyed(upstream, oidc={"issuer": issuer.url, "client_id": CLIENT_ID,
                                "client_secret": "$CONSOLE_CLIENT_SECRET", "roles": ROLES})
    if database:
        doc["database"] = database
    return doc


@pytest.fixture
def gateway(start_gateway: Callable[..., GatewayProcess],
            upstream_factory: Callable[[str], FakeUpstream],
            issuer: FakeIssuer) -> GatewayProcess:
    doc = sso(upstream_factory("sso"), issuer)
    doc["logs"] = {}  # the request log on: a team admin's overview draws their traffic from it
    return start_gateway(doc, env={"CONSOLE_CLIENT_SECRET": CLIENT_SECRET})


def sign_in(gateway: GatewayProcess) -> httpx.Response:
    """The browser's round trip, by hand: /ui/login, the issuer, the callback; its answer
    (the client keeps the cookies)."""
    client = httpx.Client(base_url=gateway.url, timeout=10)
    start = client.get("/ui/login")
    assert start.status_code == 303, start.text
    back = httpx.get(start.headers["location"], timeout=10)
    assert back.status_code == 302, back.text
    answer = client.get(back.headers["location"])
    answer.extensions["client"] = client
    return answer


def session_cookie(answer: httpx.Response) -> str | None:
    return next((c.split(";")[0] for c in answer.headers.get_list("set-cookie")
                 if c.startswith("llms_console=") and "Max-Age=0" not in c), None)


@pytest.fixture
def teams(gateway: GatewayProcess) -> dict[str, dict[str, Any]]:
    """Teams red and blue, a key in each that spent something."""
    admin = Admin(gateway, KEY)
    made = {}
    for team in ("red", "blue"):
        admin.team(name=team, budget={"usd": 50.0, "period": "month"})
        made[team] = admin.key(name=f"{team}-service", team=team)
        for _ in range(2 if team == "red" else 1):
            assert teams_chat(gateway, made[team]["key"]).status_code == 200
    return made


async def sso_page(page: browser.Page, url: str) -> None:
    """From the console's sign-in to the issuer and back, as a person clicks through it."""
    await page.send("Network.enable")
    await page.send("Network.clearBrowserCookies")
    await page.goto(f"{url}/ui")
    await page.wait_for("document.body.dataset.page === 'login' && "
                        "!document.getElementById('sso').hidden")
    await page.click("#sso-link")


async def refused_page(page: browser.Page) -> dict[str, Any]:
    await page.wait_for("document.body.classList.contains('refused')")
    return {"title": await page.evaluate("document.title"), "why": await page.text("#why"),
            "session": await page.evaluate(
                "fetch('/ui/session').then(r => r.json()).then(s => s.signed_in)")}


CALL = """fetch(%s, {method: %s, credentials: 'same-origin',
  headers: {'content-type': 'application/json', 'x-csrf-token': %s},
  body: %s}).then(async r => [r.status, (await r.json()).error?.message ?? null])"""


async def call(page: browser.Page, path: str, method: str = "GET",
               body: Any = None) -> list[Any]:
    """An admin API call from the page, with its session's CSRF token, as the console makes."""
    csrf = await page.evaluate("fetch('/ui/session').then(r => r.json()).then(s => s.csrf)")
    sent = "undefined" if body is None else json.dumps(json.dumps(body))
    said: list[Any] = await page.evaluate(CALL % (json.dumps(path), json.dumps(method),
                                                  json.dumps(csrf), sent))
    return said


# -- an admin: lands on the overview, every page, changes audited in their name ---------------


@needs_chromium
def test_an_admin_signs_in_lands_on_the_overview_and_each_change_is_audited_as_them(
        gateway: GatewayProcess, issuer: FakeIssuer, teams: dict[str, Any],
        tmp_path: Path) -> None:
    with browser.launched(tmp_path) as port:
        seen = asyncio.run(admin_story(gateway.url, port, tmp_path))

    audit = Admin(gateway, KEY).call("GET", "/admin/audit").json()["data"]
    mine = [(a["action"], a["target"]) for a in audit if a["actor"] == "ada@example.com"]
    assert seen["landed"] == "overview" and seen["who"].startswith("ada@example.com · admin")
    assert seen["charts"] == ["chart-rps", "chart-errors", "chart-latency", "chart-spend"]
    assert seen["secret"].startswith("sk-llms-") and seen["secret_once"] is False
    assert seen["disabled_badge"] == "disabled"
    assert ("provider_disabled", "main") in mine and ("provider_enabled", "main") in mine
    assert any(action == "key_created" for action, _ in mine)
    assert seen["config_hidden"] and CLIENT_SECRET not in seen["config"]


async def admin_story(url: str, port: int, tmp_path: Path) -> dict[str, Any]:
    async with browser.open_page(port) as page:
        await page.goto(f"{url}/ui")
        await page.wait_for("document.body.dataset.page === 'login'")
        shoot(await picture(page), "sign-in", tmp_path)
        await sso_page(page, url)
        await page.wait_for("document.body.dataset.page === 'overview' && "
                            "document.body.dataset.ready === 'true' && "
                            "document.querySelectorAll('#chart-rps text.x').length > 0")
        seen: dict[str, Any] = {"landed": await page.evaluate("document.body.dataset.page"),
                                "who": await page.text("#who"),
                                "charts": await page.evaluate(
                                    "[...document.querySelectorAll('svg.chart')].map(s => s.id)")}
        shoot(await picture(page), "overview", tmp_path)
        await show(page, url, "keys")
        await page.type("#new-key input[name=name]", "ada-notebook")
        await page.evaluate("document.querySelector('#new-key select[name=team]').value = 'red'")
        await page.type("#new-key input[name=usd]", "25")
        await page.click("#new-key button")
        seen["secret"] = await page.wait_for(
            "document.getElementById('new-secret')?.textContent")
        shoot(await picture(page), "keys", tmp_path)
        await show(page, url, "keys")
        seen["secret_once"] = await page.evaluate(
            f"document.body.innerText.includes({json.dumps(seen['secret'])})")
        await show(page, url, "spend")
        await page.wait_for("document.querySelectorAll('#spend-by-key .share').length > 0")
        shoot(await picture(page), "spend", tmp_path)
        await show(page, url, "providers")
        await page.click("button[data-toggle=disable]")
        seen["disabled_badge"] = await page.wait_for(
            "document.querySelector('li[data-name=main]')?.dataset.health === 'disabled' "
            "&& 'disabled'")
        shoot(await picture(page), "providers", tmp_path)
        await page.click("button[data-toggle=enable]")
        await page.wait_for(
            "document.querySelector('li[data-name=main]')?.dataset.health === 'ok'")
        await show(page, url, "config")
        seen["config"] = await page.text("#config")
        seen["config_hidden"] = '"client_secret": "$CONSOLE_CLIENT_SECRET"' in seen["config"]
        shoot(await picture(page), "config", tmp_path)
        return seen  # the logs page's pictures: tests/test_console.py, on real requests


# -- a viewer reads everything, changes nothing ------------------------------------------------


@needs_chromium
def test_a_viewer_reads_every_page_and_each_change_is_refused(
        gateway: GatewayProcess, issuer: FakeIssuer, teams: dict[str, Any],
        tmp_path: Path) -> None:
    issuer.sign_in_as("u-2", "grace@example.com", ["llms-viewers"])
    before = Admin(gateway, KEY).call("GET", "/admin/keys").json()["data"]

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(viewer_story(gateway.url, port))

    assert seen["who"].startswith("grace@example.com · viewer")
    assert seen["read_only"] and seen["forms"] == 0, "no form offers a change"
    assert seen["keys_listed"] == 2
    for status, message in seen["writes"]:
        assert status == 403 and "viewer" in message, seen["writes"]
    assert Admin(gateway, KEY).call("GET", "/admin/keys").json()["data"] == before
    assert seen["providers_read"] == 200


async def viewer_story(url: str, port: int) -> dict[str, Any]:
    async with browser.open_page(port) as page:
        await sso_page(page, url)
        await page.wait_for("document.body.dataset.page === 'overview' && "
                            "document.body.dataset.ready === 'true'")
        seen: dict[str, Any] = {"who": await page.text("#who")}
        await show(page, url, "keys")
        seen["read_only"] = await page.evaluate("Boolean(document.getElementById('read-only'))")
        seen["forms"] = await page.evaluate("document.querySelectorAll('main form').length")
        seen["keys_listed"] = await page.evaluate(
            "document.querySelectorAll('tr[data-key]').length")
        seen["writes"] = [await call(page, "/admin/keys", "POST", {"name": "sneaky"}),
                          await call(page, "/admin/providers/main/disable", "POST"),
                          await call(page, "/admin/teams/red", "DELETE")]
        seen["providers_read"] = (await call(page, "/admin/providers"))[0]
        return seen


# -- a team admin: their team, nothing else ----------------------------------------------------


@needs_chromium
def test_a_team_admin_sees_and_runs_only_their_own_team(
        gateway: GatewayProcess, issuer: FakeIssuer, teams: dict[str, Any],
        tmp_path: Path) -> None:
    issuer.sign_in_as("u-3", "linus@example.com", ["red-admins", "unrelated-group"])

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(team_story(gateway.url, port, teams))

    red, blue = teams["red"]["id"], teams["blue"]["id"]
    assert seen["who"].startswith("linus@example.com · team admin of red")
    assert seen["nav"] == ["overview", "logs", "keys", "spend"]
    assert seen["traffic"] == "2", "red's two requests, from the request log"
    assert seen["logs"] == 2, "red's requests alone on the logs page"
    assert seen["keys"] == [red] and seen["teams"] == ["red"]
    assert seen["spend_teams"] == ["red"] and seen["spend_keys"] == [red]
    assert seen["other_key"][0] == 404 and "blue-service" not in str(seen["other_key"])
    assert seen["providers"][0] == seen["config"][0] == seen["audit"][0] == 403
    assert seen["new_team"][0] == 403 and seen["status"][0] == 401
    assert seen["in_blue"][0] == 403 and seen["revoke_blue"][0] == 404
    assert seen["in_red"][0] == 201
    shown = Admin(gateway, KEY).call("GET", f"/admin/keys/{blue}").json()
    assert shown["revoked_at"] is None


async def team_story(url: str, port: int, teams: dict[str, Any]) -> dict[str, Any]:
    blue = teams["blue"]["id"]
    async with browser.open_page(port) as page:
        await sso_page(page, url)
        await page.wait_for("document.body.dataset.page === 'overview' && "
                            "document.body.dataset.ready === 'true'")
        seen: dict[str, Any] = {"who": await page.text("#who"), "nav": await page.evaluate(
            "[...document.querySelectorAll('#nav a')].filter(a => !a.hidden)"
            ".map(a => a.dataset.page)")}
        seen["traffic"] = await page.wait_for(
            "document.getElementById('chart-team-requests')?.dataset.requests")
        await show(page, url, "logs")
        seen["logs"] = await page.evaluate("document.querySelectorAll('tr.row').length")
        await show(page, url, "keys")
        seen["keys"] = await page.evaluate(
            "[...document.querySelectorAll('tr[data-key]')].map(r => r.dataset.key)")
        seen["teams"] = await page.evaluate(
            "[...document.querySelectorAll('tr[data-team]')].map(r => r.dataset.team)")
        await show(page, url, "spend")
        for group in ("team", "key"):
            seen[f"spend_{group}s"] = await page.evaluate(
                f"[...document.querySelectorAll('#spend-by-{group} tr[data-group]')]"
                ".map(r => r.dataset.group)")
        seen["other_key"] = await call(page, f"/admin/keys/{blue}")
        seen["providers"] = await call(page, "/admin/providers")
        seen["config"] = await call(page, "/admin/config")
        seen["audit"] = await call(page, "/admin/audit")
        seen["status"] = await call(page, "/status.json")
        seen["new_team"] = await call(page, "/admin/teams", "POST", {"name": "green"})
        seen["in_blue"] = await call(page, "/admin/keys", "POST", {"name": "x", "team": "blue"})
        seen["revoke_blue"] = await call(page, f"/admin/keys/{blue}", "DELETE")
        seen["in_red"] = await call(page, "/admin/keys", "POST", {"name": "y", "team": "red"})
        return seen



# -- the request log, read by each role ---------------------------------------------------------


def test_each_role_reads_the_request_log_a_team_admin_only_their_team_s_requests(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], issuer: FakeIssuer) -> None:
    doc = sso(upstream_factory("logged"), issuer)
    doc["logs"] = {"capture": "bodies"}
    gateway = start_gateway(doc, env={"CONSOLE_CLIENT_SECRET": CLIENT_SECRET})
    admin = Admin(gateway, KEY)
    sent: dict[str, list[str]] = {}
    for team, requests in (("red", 2), ("blue", 1)):
        admin.team(name=team)
        made = admin.key(name=f"{team}-service", team=team)
        sent[team] = [teams_chat(gateway, made["key"]).headers["x-request-id"]
                      for _ in range(requests)]
    everything = {*sent["red"], *sent["blue"]}

    def listed(client: httpx.Client | None, **params: str) -> set[str]:
        answer = (client.get("/admin/logs", params=params) if client else
                  admin.call("GET", "/admin/logs", params=params))
        assert answer.status_code == 200, answer.text
        return {row["request_id"] for row in answer.json()["data"]}

    def one(client: httpx.Client, request_id: str) -> httpx.Response:
        return client.get(f"/admin/logs/{request_id}")

    def session(sub: str, email: str, groups: list[str]) -> httpx.Client:
        issuer.sign_in_as(sub, email, groups)
        signed = sign_in(gateway)
        assert signed.status_code == 303, signed.text
        client: httpx.Client = signed.extensions["client"]
        return client

    assert listed(None) == everything, "an admin key, as before"
    ada = session("u-1", "ada@example.com", ["llms-admins"])
    grace = session("u-2", "grace@example.com", ["llms-viewers"])
    linus = session("u-3", "linus@example.com", ["red-admins"])
    assert listed(ada) == listed(grace) == everything
    assert one(grace, sent["blue"][0]).json()["request_body"] is not None, "bodies: stored"
    assert listed(linus) == set(sent["red"]), "a team admin: their team's rows alone"
    assert listed(linus, team="blue") == set() and listed(linus, team="red") == set(sent["red"])
    red = one(linus, sent["red"][0])
    assert red.status_code == 200 and red.json()["team"] == "red"
    assert "hello" in red.json()["request_body"], "their team's bodies included"
    other = one(linus, sent["blue"][0])
    assert other.status_code == 404 and sent["blue"][0] in other.json()["error"]["message"]
    exported = linus.get("/admin/logs", params={"format": "ndjson"})
    assert {json.loads(line)["request_id"] for line in exported.text.splitlines()} == \
        set(sent["red"])


# -- what is refused: each a 401 page, never a session -----------------------------------------


@needs_chromium
def test_a_forged_state_a_wrong_audience_an_expired_token_and_a_bad_signature_are_refused(
        gateway: GatewayProcess, issuer: FakeIssuer, tmp_path: Path) -> None:
    # The attacker's own sign-in, stopped before its callback: a link they send a victim.
    start = httpx.get(f"{gateway.url}/ui/login")
    lure = httpx.get(start.headers["location"]).headers["location"]

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(refusals(gateway.url, port, issuer, lure))

    assert set(seen) == {"forged_state", "wrong_aud", "expired", "bad_signature"}
    for fault, page in seen.items():
        assert page["title"] == "Sign-in refused" and page["session"] is False, (fault, page)
    assert "state does not match" in seen["forged_state"]["why"]
    assert "aud" in seen["wrong_aud"]["why"]
    assert "expired" in seen["expired"]["why"]
    assert "signature does not verify" in seen["bad_signature"]["why"]


async def refusals(url: str, port: int, issuer: FakeIssuer, lure: str) -> dict[str, Any]:
    seen = {}
    async with browser.open_page(port) as page:
        await page.send("Network.enable")
        await page.goto(lure)
        seen["forged_state"] = await refused_page(page)
        for fault in ("wrong_aud", "expired", "bad_signature"):
            issuer.fault = fault
            await sso_page(page, url)
            seen[fault] = await refused_page(page)
    return seen


@pytest.mark.parametrize("fault", ["wrong_aud", "expired", "bad_signature", "wrong_nonce"])
def test_each_bad_token_is_a_401_and_sets_no_session(gateway: GatewayProcess,
                                                     issuer: FakeIssuer, fault: str) -> None:
    issuer.fault = fault

    answer = sign_in(gateway)

    assert answer.status_code == 401, answer.text
    assert session_cookie(answer) is None
    assert answer.extensions["client"].get("/ui/session").json()["signed_in"] is False


def test_a_callback_whose_state_is_not_this_browser_s_is_refused(
        gateway: GatewayProcess, issuer: FakeIssuer) -> None:
    client = httpx.Client(base_url=gateway.url, timeout=10)
    start = client.get("/ui/login")
    back = httpx.get(start.headers["location"]).headers["location"]
    forged = back.replace("state=", "state=x")

    answer = client.get(forged)

    assert answer.status_code == 401 and session_cookie(answer) is None
    assert issuer.tokens_issued == 0, "the code was never exchanged"


def test_someone_no_role_names_gets_a_403_page_and_no_session(
        gateway: GatewayProcess, issuer: FakeIssuer) -> None:
    issuer.sign_in_as("u-9", None, ["interns"])

    answer = sign_in(gateway)

    assert answer.status_code == 403 and "u-9" in answer.text
    assert session_cookie(answer) is None


def test_a_rotated_signing_key_is_fetched_and_made_up_key_ids_fetch_a_bounded_number_of_times(
        gateway: GatewayProcess, issuer: FakeIssuer) -> None:
    assert sign_in(gateway).status_code == 303
    issuer.rotate()

    rotated = sign_in(gateway)
    fetched_for_rotation = issuer.jwks_fetches
    issuer.fault = "unknown_kid"
    floods = [sign_in(gateway).status_code for _ in range(6)]

    assert rotated.status_code == 303 and session_cookie(rotated) is not None
    assert fetched_for_rotation == 2
    assert floods == [401] * 6
    assert issuer.jwks_fetches - fetched_for_rotation <= 2, "3 refetches a minute at most"


# -- signing out holds everywhere --------------------------------------------------------------


@needs_chromium
def test_a_sign_out_on_one_gateway_holds_on_the_other_sharing_the_database(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], issuer: FakeIssuer,
        tmp_path: Path) -> None:
    upstream = upstream_factory("shared")
    shared = {"url": f"sqlite:///{tmp_path / 'shared.db'}"}
    env = {"CONSOLE_CLIENT_SECRET": CLIENT_SECRET}
    first = start_gateway(sso(upstream, issuer, **shared), env=env)
    (tmp_path / "second").mkdir()
    second = GatewayProcess(tmp_path / "second", sso(upstream, issuer, **shared), env=env)
    try:
        second.start()
        with browser.launched(tmp_path) as port:
            seen = asyncio.run(sign_out_story(first.url, second.url, port))
        kept = httpx.get(f"{first.url}/admin/keys", headers={"cookie": seen["cookie"]})
    finally:
        second.stop()

    assert seen["on_second"].startswith("ada@example.com"), "one session, both gateways"
    assert seen["first_after"] == "login" and seen["second_after"] == "login"
    assert kept.status_code == 401, "the old cookie, replayed, is refused where it was made"


async def sign_out_story(first: str, second: str, port: int) -> dict[str, Any]:
    async with browser.open_page(port) as page:
        await sso_page(page, first)
        await page.wait_for("document.body.dataset.page === 'overview'")
        cookies = (await page.send("Network.getCookies", urls=[first]))["cookies"]
        seen: dict[str, Any] = {"cookie": next(f"{c['name']}={c['value']}" for c in cookies
                                               if c["name"] == "llms_console")}
        await show(page, second, "overview")
        seen["on_second"] = await page.text("#who")
        await page.click("#logout")
        await page.wait_for("document.body.dataset.page === 'login'")
        # The cookie is gone from the browser: put it back, as a thief who copied it would.
        name, value = seen["cookie"].split("=", 1)
        await page.send("Network.setCookie", name=name, value=value, url=first)
        await page.goto(f"{first}/ui")
        await page.wait_for("['login', 'overview'].includes(document.body.dataset.page)")
        seen["first_after"] = await page.evaluate("document.body.dataset.page")
        await page.goto(f"{second}/ui")
        await page.wait_for("['login', 'overview'].includes(document.body.dataset.page)")
        seen["second_after"] = await page.evaluate("document.body.dataset.page")
        return seen


# -- the settings, and the roles (pure) --------------------------------------------------------


def test_an_http_issuer_is_allowed_on_this_machine_only_and_typos_are_named() -> None:
    def parse(ui: dict[str, Any]) -> Any:
        text = json.dumps({"providers": {}, "ui": ui})
        return gateway_config.parse(text, Path("llms.json"), {"SECRET": "s3cret-value"})

    local = parse({"oidc": {"issuer": "http://127.0.0.1:9000/", "client_id": "c",
                            "client_secret": "$SECRET"}})
    assert local.ui.oidc.issuer == "http://127.0.0.1:9000"
    assert local.ui.oidc.client_secret == "s3cret-value"
    with pytest.raises(ConfigError, match=r"ui.oidc.issuer: .* must be https"):
        parse({"oidc": {"issuer": "http://login.example.com", "client_id": "c"}})
    with pytest.raises(ConfigError, match=r"did you mean `key_login`"):
        parse({"key_logins": False})
    with pytest.raises(ConfigError, match=r"ui.oidc.client_secret: UNSET_ONE is not set"):
        parse({"oidc": {"issuer": "https://x.example", "client_id": "c",
                        "client_secret": "$UNSET_ONE"}})


def test_the_widest_role_wins_and_the_actor_is_the_email_else_the_subject() -> None:
    roles = OidcRoles(claim="roles", admin=("ops",), viewer=("audit",),
                      team_admin={"red-leads": "red", "blue-leads": "blue"})

    assert role_of({"roles": ["audit", "ops"]}, roles) == ("admin", ())
    assert role_of({"roles": "audit"}, roles) == ("viewer", ())
    assert role_of({"roles": ["blue-leads", "red-leads"]}, roles) == ("team_admin",
                                                                      ("blue", "red"))
    assert role_of({"roles": ["interns"]}, roles) is None
    assert role_of({"groups": ["ops"]}, roles) is None, "another claim names no role"
    assert actor_of({"sub": "u-1", "email": "ada@example.com"}) == "ada@example.com"
    assert actor_of({"sub": "u-1"}) == "u-1"
    assert actor_of({"sub": "u-1", "email": "ceo@example.com", "email_verified": False}) == "u-1"
