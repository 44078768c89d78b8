"""An operator opens the console at /ui with an admin key (no single sign-on configured): the
key is sent once and kept nowhere, the session is a cookie no script can read, every change it
makes carries its CSRF token, and what the console renders of user data stays text."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests import browser
from tests.gateway_process import ROOT, GatewayProcess, config, provider, wait_until
from tests.test_teams import PRICE, Admin, priced
from tests.test_teams import chat as teams_chat
from tests.upstream import FakeUpstream, status

KEY = "admin-console-key-0001"
CHROMIUM = browser.CHROMIUM
SHOTS = ROOT / "docs" / "console"
# A key name an attacker would choose: markup that runs if the console ever parsed it as HTML.
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'


def keyed(upstream: FakeUpstream, **ui: Any) -> dict[str, Any]:
    """A priced gateway with an admin key (its id `ops`), and `ui` as given."""
    doc = priced(upstream, "m", server={"admin_keys": [{"key": KEY, "id": "ops"}]})
    if ui:
        doc["ui"] = ui
    return doc


def signed_in(gateway: GatewayProcess, key: str = KEY
              ) -> tuple[httpx.Client, dict[str, Any], str]:
    """A client holding a console session opened with `key`, what the console said, and the
    `Set-Cookie` it was sent."""
    client = httpx.Client(base_url=gateway.url, timeout=10)
    answer = client.post("/ui/login/key", json={"key": key})
    assert answer.status_code == 200, answer.text
    return client, answer.json(), answer.headers["set-cookie"]


def shoot(picture: str, name: str, tmp_path: Path) -> None:
    """A page's picture: kept beside the test, and in docs/console/ with UPDATE_SCREENSHOTS=1."""
    data = base64.b64decode(picture)
    assert len(data) > 10_000, name
    (tmp_path / f"{name}.png").write_bytes(data)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        (SHOTS / f"{name}.png").write_bytes(data)


async def picture(page: browser.Page, width: int = 1100) -> str:
    """The whole page at a desktop's width, as PNG in base64."""
    await page.send("Emulation.setDeviceMetricsOverride", width=width, height=800,
                    deviceScaleFactor=1, mobile=False)
    height = await page.evaluate("document.documentElement.scrollHeight")
    await page.send("Emulation.setDeviceMetricsOverride", width=width, height=max(600, height),
                    deviceScaleFactor=1, mobile=False)
    shot: str = (await page.send("Page.captureScreenshot", format="png"))["data"]
    return shot


async def show(page: browser.Page, url: str, where: str) -> None:
    """Open the console afresh at `#where` and wait until that page has drawn."""
    await page.goto("about:blank")
    await page.wait_for("location.href === 'about:blank'")
    await page.goto(f"{url}/ui#{where}")
    await page.wait_for(f"document.body.dataset.page === '{where.split('/')[0]}' && "
                        "document.body.dataset.ready === 'true'")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_an_admin_key_signs_in_once_is_kept_nowhere_and_user_data_stays_text(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    gateway = start_gateway(keyed(upstream_factory("console")))
    admin = Admin(gateway, KEY)
    hostile = admin.key(name=HOSTILE)
    assert teams_chat(gateway, hostile["key"]).status_code == 200

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(sign_in_with_keys(gateway.url, port))

    assert seen["asked"] and seen["sso_offered"] is False
    assert "Not an admin key" in seen["wrong"], seen
    assert seen["who"].startswith("ops · admin"), seen
    for place in ("href", "storage", "cookie_seen_by_script"):
        assert KEY not in seen[place] and "wrong-key-123" not in seen[place], (place, seen)
    assert seen["cookie_seen_by_script"] == "", "the session cookie is HttpOnly"
    assert seen["hostile_shown"] == HOSTILE, "the name is shown as the text it is"
    assert seen["images"] == 0 and seen["pwned"] is None
    assert "No request logged yet" in seen["logs"], "no request log: said, not failed"
    assert seen["after_sign_out"] == "login" and seen["session_after"] is False
    assert KEY not in gateway.logs()


async def sign_in_with_keys(url: str, port: int) -> dict[str, Any]:
    async with browser.open_page(port) as page:
        await page.goto(f"{url}/ui")
        await page.wait_for("document.body.dataset.page === 'login'")
        seen: dict[str, Any] = {
            "asked": await page.evaluate("!document.getElementById('key-form').hidden"),
            "sso_offered": not await page.evaluate("document.getElementById('sso').hidden")}
        await page.type("#key", "wrong-key-123")
        await page.click("#key-form button")
        await page.wait_for("document.body.dataset.page === 'login-refused'")
        seen["wrong"] = await page.text("#login-said")
        await page.type("#key", KEY)
        await page.click("#key-form button")
        await page.wait_for("document.body.dataset.page === 'overview' && "
                            "document.body.dataset.ready === 'true'")
        seen["who"] = await page.text("#who")
        seen["href"] = await page.evaluate("location.href")
        seen["storage"] = await page.evaluate(
            "JSON.stringify([{...sessionStorage}, {...localStorage}])")
        seen["cookie_seen_by_script"] = await page.evaluate("document.cookie")
        await show(page, url, "keys")
        seen["hostile_shown"] = await page.evaluate(
            "[...document.querySelectorAll('tr[data-key] td:first-child')]"
            ".map(td => td.textContent).find(t => t.includes('img')) || ''")
        seen["images"] = await page.evaluate("document.querySelectorAll('main img').length")
        seen["pwned"] = await page.evaluate("document.body.dataset.pwned ?? null")
        await show(page, url, "logs")
        seen["logs"] = await page.wait_for(
            "document.getElementById('logs-empty')?.textContent")
        await page.click("#logout")
        await page.wait_for("document.body.dataset.page === 'login'")
        seen["after_sign_out"] = await page.evaluate("document.body.dataset.page")
        seen["session_after"] = await page.evaluate(
            "fetch('/ui/session').then(r => r.json()).then(s => s.signed_in)")
        return seen


def test_key_login_can_be_turned_off_and_admin_keys_still_work_for_the_api(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    gateway = start_gateway(keyed(upstream_factory("off"), key_login=False))

    said = httpx.get(f"{gateway.url}/ui/session").json()
    refused = httpx.post(f"{gateway.url}/ui/login/key", json={"key": KEY})

    assert said["key_login"] is False and said["signed_in"] is False
    assert refused.status_code == 403 and "ui.key_login" in refused.json()["error"]["message"]
    assert "set-cookie" not in refused.headers
    assert Admin(gateway, KEY).call("GET", "/admin/keys").status_code == 200


def test_a_session_s_cookie_is_locked_down_and_each_change_needs_its_csrf_token(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    gateway = start_gateway(keyed(upstream_factory("csrf"), session_hours=2))
    client, session, cookie = signed_in(gateway)

    bare = client.post("/admin/teams", json={"name": "red"})
    forged = client.post("/admin/teams", json={"name": "red"},
                         headers={"x-csrf-token": "guessed-token-value"})
    made = client.post("/admin/teams", json={"name": "red"},
                       headers={"x-csrf-token": session["csrf"]})
    audit = Admin(gateway, KEY).call("GET", "/admin/audit").json()["data"]

    parts = {p.strip().split("=")[0].lower(): p.strip() for p in cookie.split(";")}
    assert "httponly" in parts and parts["samesite"].lower() == "samesite=lax"
    assert parts["path"] == "Path=/" and "domain" not in parts
    assert parts["max-age"] == "Max-Age=7200", "bounded by ui.session_hours"
    assert "secure" not in parts, "plain http on loopback: a Secure cookie would be dropped"
    assert bare.status_code == forged.status_code == 403, (bare.text, forged.text)
    assert "CSRF" in bare.json()["error"]["message"]
    assert made.status_code == 201, made.text
    assert [(a["actor"], a["action"]) for a in audit] == [("ops", "team_created")]


def test_a_session_ends_when_its_time_is_up_and_then_reads_nothing(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    gateway = start_gateway(keyed(upstream_factory("short"), session_hours=0.0005))  # 1.8 s
    _, _, cookie = signed_in(gateway)
    # The browser would drop the cookie at its Max-Age; one kept past it is refused all the same.
    kept = {"cookie": cookie.split(";")[0]}
    assert httpx.get(f"{gateway.url}/admin/keys", headers=kept).status_code == 200

    wait_until(lambda: httpx.get(f"{gateway.url}/ui/session", headers=kept
                                 ).json()["signed_in"] is False, within=10)
    answer = httpx.get(f"{gateway.url}/admin/keys", headers=kept)

    assert answer.status_code == 401 and "sign in again" in answer.json()["error"]["message"]


def test_the_config_in_force_is_shown_with_every_secret_hidden(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("config")
    doc = config({"openai": provider(up.base_url, {"m": "m"},
                                     headers={"x-org-token": "header-secret-value-7"}),
                  "other": provider(up.base_url, {"m": "m"}, api_key="$OTHER_PROVIDER_KEY")},
                 server={"admin_keys": [{"key": KEY, "id": "ops"}],
                         "api_keys": ["client-key-config-0001"]})
    doc["ui"] = {"oidc": {"issuer": "https://login.example.com", "client_id": "console",
                          "client_secret": "oidc-client-secret-99"}}
    gateway = start_gateway(doc, env={"OTHER_PROVIDER_KEY": "sk-other-provider-secret-1"})

    answer = Admin(gateway, KEY).call("GET", "/admin/config")
    shown = answer.json()["config"]

    assert answer.status_code == 200
    for secret in ("sk-test-secret-123456", "header-secret-value-7", KEY,
                   "client-key-config-0001", "oidc-client-secret-99",
                   "sk-other-provider-secret-1"):
        assert secret not in answer.text, secret
    assert shown["providers"]["openai"]["api_key"] == "***"
    assert shown["providers"]["other"]["api_key"] == "$OTHER_PROVIDER_KEY", "a name, no secret"
    assert shown["providers"]["openai"]["base_url"] == up.base_url
    assert shown["server"]["admin_keys"] == [{"key": "***", "id": "ops"}]
    assert shown["ui"]["oidc"]["client_id"] == "console"
    assert httpx.get(f"{gateway.url}/admin/config",
                     headers={"Authorization": "Bearer client-key-config-0001"}
                     ).status_code == 403


def test_the_console_s_pages_load_only_its_own_scripts_and_no_other_file(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    gateway = start_gateway(keyed(upstream_factory("static")))

    page = httpx.get(f"{gateway.url}/ui")
    script = httpx.get(f"{gateway.url}/ui/static/app.js")
    elsewhere = [httpx.get(f"{gateway.url}/ui/static/{name}").status_code
                 for name in ("..%2Fstatus.html", "status.html", "index.html", "nope.js")]

    policy = page.headers["content-security-policy"]
    assert page.status_code == 200 and "script-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert "<script" in page.text and "http" not in page.text.split("<body")[0].replace(
        "http-equiv", ""), "no script or style from another origin"
    assert script.headers["content-type"].startswith("text/javascript")
    assert elsewhere == [404, 404, 404, 404]


def test_without_an_admin_key_this_machine_is_the_console_s_admin(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    gateway = start_gateway(priced(upstream_factory("local"), "m"))

    said = httpx.get(f"{gateway.url}/ui/session").json()
    forwarded = httpx.get(f"{gateway.url}/ui/session",
                          headers={"x-forwarded-for": "203.0.113.9"}).json()

    assert (said["signed_in"], said["role"], said["via"]) == (True, "admin", "local")
    assert forwarded["signed_in"] is False, "a proxy's request is not this machine"


# -- the logs page, on the real request log ------------------------------------------------------

CLIENT_KEY, PRIVATE_KEY = "client-console-key-0001", "private-console-key-0001"


def logging_gateway(first: FakeUpstream, second: FakeUpstream, tmp_path: Path
                    ) -> dict[str, Any]:
    """Alias `m` served by `first` then `second`, `kept` by `second` with its bodies captured;
    the request log on (metadata), in a SQLite file of the test's own; a client key and a
    `private` one."""
    models = {"m": {"id": "m-upstream", "price": PRICE}}
    doc = config({"first": provider(first.base_url, models),
                  "second": provider(second.base_url, {
                      **models, "kept": {"id": "kept-upstream", "price": PRICE}})},
                 defaults={"circuit": {"enabled": False}},
                 database={"url": f"sqlite:///{tmp_path / 'accounts.db'}"},
                 server={"admin_keys": [{"key": KEY, "id": "ops"}],
                         "api_keys": [{"key": CLIENT_KEY, "id": "notebook"},
                                      {"key": PRIVATE_KEY, "id": "hr-bot", "private": True}]})
    doc["logs"] = {"capture": "metadata"}
    doc["models"] = {"kept": {"logs": {"capture": "bodies"}}}
    return doc


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_a_request_made_with_the_openai_sdk_is_found_in_the_console_by_its_request_id(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    """Issue 45's "done when": a failover found in the UI with its two attempts, its tokens and
    cost as the answer and the spend table say; bodies disabled, not captured and stored, each
    shown as such, and a body full of markup shown as text."""
    first, second = upstream_factory("first"), upstream_factory("second")
    gateway = start_gateway(logging_gateway(first, second, tmp_path))
    first.set_mode(status(500, "first is down"))
    client = openai.OpenAI(base_url=gateway.base_url, api_key=CLIENT_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "why is the sky blue?"}])
    answer, failover = raw.parse(), raw.headers["x-request-id"]
    stored = teams_chat(gateway, CLIENT_KEY, "kept", messages=[
        {"role": "user", "content": HOSTILE}]).headers["x-request-id"]
    private = teams_chat(gateway, PRIVATE_KEY, "kept").headers["x-request-id"]
    assert raw.headers["x-llms-attempts"] == "2" and answer.usage is not None

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(find_requests(gateway.url, port, failover,
                                         {"disabled": failover, "stored": stored,
                                          "not_captured": private}, tmp_path))

    assert seen["listed"] == [private, stored, failover], "newest first"
    assert seen["opened"] == f"Request {failover}", "found by its x-request-id"
    assert seen["attempts"] == [["1. first", "failed", "failed · 500 · unavailable"],
                                ["2. second", "answered", "answered"]]
    facts = seen["facts"]
    assert (facts["provider"], facts["alias"], facts["key"]) == ("second", "m", "notebook")
    assert (int(facts["prompt_tokens"]), int(facts["completion_tokens"])) == (
        answer.usage.prompt_tokens, answer.usage.completion_tokens)
    assert facts["cost"] == f"${raw.headers['x-llms-cost']}", "to the millionth, as the header"
    assert httpx.get(f"{gateway.url}/admin/spend", timeout=10,
                     headers={"Authorization": f"Bearer {KEY}"}).status_code == 200  # written
    with sqlite3.connect(tmp_path / "accounts.db") as db:
        spent = db.execute("SELECT prompt_tokens, completion_tokens, cost FROM spend "
                           "WHERE request_id = ?", (failover,)).fetchall()
    assert len(spent) == 1 and spent[0][:2] == (answer.usage.prompt_tokens,
                                                answer.usage.completion_tokens)
    assert f"${spent[0][2]:.6f}" == facts["cost"], "the spend table's dollars"
    assert seen["payload"] == {"disabled": "disabled", "stored": "stored",
                               "not_captured": "not_captured"}
    assert "capture is off" in seen["said"]["disabled"]
    assert "private key" in seen["said"]["not_captured"]
    assert seen["bodies"]["disabled"] == seen["bodies"]["not_captured"] == []
    assert seen["bodies"]["stored"] == ["request", "response"]
    sent = json.loads(seen["request_body"])  # laid out to be read, as the JSON it is
    assert sent["messages"][0]["content"] == HOSTILE, "markup shown as the text it is"
    assert seen["injected"] == 0 and seen["pwned"] is None
    assert seen["unknown"] == "No request nope in the log."


async def find_requests(url: str, port: int, failover: str, payloads: dict[str, str],
                        tmp_path: Path) -> dict[str, Any]:
    async with browser.open_page(port) as page:
        await page.goto(f"{url}/ui")
        await page.wait_for("document.body.dataset.page === 'login'")
        await page.type("#key", KEY)
        await page.click("#key-form button")
        await page.wait_for("document.body.dataset.page === 'overview'")
        await show(page, url, "logs")
        seen: dict[str, Any] = {"listed": await page.wait_for(
            "[...document.querySelectorAll('tr.row')].map(r => r.dataset.requestId)")}
        shoot(await picture(page), "logs", tmp_path)
        await page.type("#request-id", failover)
        await page.click("#jump button")
        await page.wait_for("document.body.dataset.ready === 'true' && "
                            "Boolean(document.getElementById('attempts'))")
        seen["opened"] = await page.text("main h2")
        seen["attempts"] = await page.evaluate(
            "[...document.querySelectorAll('#attempts li')].map(li => ["
            "li.querySelector('.what').textContent.trim(), li.dataset.outcome, "
            "li.querySelector('.outcome').textContent])")
        seen["facts"] = await page.evaluate(
            "Object.fromEntries([...document.querySelectorAll('#log-facts dd')]"
            ".map(dd => [dd.dataset.field, dd.textContent]))")
        shoot(await picture(page), "log", tmp_path)
        seen["payload"], seen["said"], seen["bodies"] = {}, {}, {}
        for payload, request_id in payloads.items():
            await show(page, url, f"logs/{request_id}")
            seen["payload"][payload] = await page.evaluate(
                "document.getElementById('payload').dataset.payload")
            seen["said"][payload] = await page.text("#payload")
            seen["bodies"][payload] = await page.evaluate(
                "[...document.querySelectorAll('pre[data-body]')].map(p => p.dataset.body)")
            if payload == "stored":
                seen["request_body"] = await page.text("pre[data-body=request]")
                seen["injected"] = await page.evaluate(
                    "document.querySelectorAll('main img, main script').length")
                seen["pwned"] = await page.evaluate("document.body.dataset.pwned ?? null")
        await show(page, url, "logs/nope")
        seen["unknown"] = await page.text("#log-missing")
        return seen
