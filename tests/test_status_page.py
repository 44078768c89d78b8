"""An operator opens the status page, sees providers in order, and disables one at live."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.accounts.account import Budget, Scope, window
from gateway.accounts.database import Database
from gateway.accounts.overview import Overview, near_limit
from gateway.accounts.service import Accounts
from gateway.accounts.spend import spend_row
from gateway.cli_ls import duration
from gateway.core.settings import DatabaseConfig
from tests import browser
from tests.fake_gpu import install_fakes
from tests.gateway_process import (
    ROOT,
    GatewayProcess,
    config,
    free_port,
    provider,
    wait_until,
)
from tests.test_teams import Admin, priced
from tests.test_teams import chat as teams_chat
from tests.upstream import FakeUpstream, ok, slow_first_token
from tests.upstream import status as answering

MESSAGES = [{"role": "user", "content": "hello"}]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEY = "admin-test-key-1"
CLIENT_KEY = "client-test-key-1"


@pytest.fixture
def three(start_gateway: Callable[..., GatewayProcess],
          upstream_factory: Callable[[str], FakeUpstream]) -> GatewayProcess:
    ups = [upstream_factory(name) for name in ("alpha", "beta", "gamma")]
    return start_gateway(config({up.name: provider(up.base_url, {"m": "m", up.name: "x"})
                                 for up in ups},
                                # The page's browser sends no key: its JSON is opened explicitly.
                                server={"api_keys": [CLIENT_KEY], "admin_keys": [KEY],
                                        "public_paths": ["/status.json"]}))


def admin(gateway: GatewayProcess, path: str, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    method = httpx.post if path.endswith(("/enable", "/disable")) else httpx.get
    return method(f"{gateway.url}/admin/{path}", headers=headers)


def chat(gateway: GatewayProcess, model: str = "m") -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions",
                      json={"model": model, "messages": MESSAGES},
                      headers={"Authorization": f"Bearer {KEY}"})


def test_without_keys_admin_answers_this_machine_but_not_what_a_proxy_forwarded(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("alpha")
    gateway = start_gateway(config({"alpha": provider(up.base_url, {"m": "m"})}))

    assert admin(gateway, "providers", key=None).status_code == 200
    for forwarded in ({"X-Forwarded-For": "203.0.113.9"}, {"Forwarded": "for=203.0.113.9"},
                      {"X-Real-IP": "203.0.113.9"}):
        relayed = httpx.get(f"{gateway.url}/admin/providers", headers=forwarded)
        assert relayed.status_code == 403, "a local reverse proxy must not open admin to all"
        assert relayed.json()["error"]["code"] == "permission_denied"


def test_admin_disables_a_provider_and_routing_follows_at_once(three: GatewayProcess) -> None:
    assert chat(three).headers["x-llms-provider"] == "alpha"
    assert admin(three, "providers", key=None).status_code == 401
    assert admin(three, "providers/alpha/disable", key="wrong").status_code == 401
    assert admin(three, "providers/nobody/disable").status_code == 404

    disabled = admin(three, "providers/alpha/disable")

    assert disabled.json()["enabled"] is False and disabled.json()["health"] == "disabled"
    assert chat(three).headers["x-llms-provider"] == "beta"
    listed = admin(three, "providers").json()["providers"]
    assert [(p["name"], p["enabled"]) for p in listed] == [
        ("alpha", False), ("beta", True), ("gamma", True)]
    models = [m["id"] for m in httpx.get(f"{three.base_url}/models", headers={
        "Authorization": f"Bearer {CLIENT_KEY}"}).json()["data"]]
    assert "alpha" not in models

    admin(three, "providers/alpha/enable")
    assert chat(three).headers["x-llms-provider"] == "alpha"


def test_status_json_has_providers_in_order_and_recent_traffic(three: GatewayProcess) -> None:
    for _ in range(5):
        chat(three)

    status = httpx.get(f"{three.url}/status.json").json()

    assert [p["name"] for p in status["providers"]] == ["alpha", "beta", "gamma"]
    assert status["providers"][0]["health"] == "ok"
    assert sum(row["rps"] for row in status["series"]) * 10 == pytest.approx(5, abs=0.01)
    assert status["summary"]["p50_ms"] is not None


def test_clients_own_errors_are_counted_apart_not_as_gateway_errors(
        three: GatewayProcess) -> None:
    """An operator's error rate is the gateway's and the providers' failures: 10 requests for an
    unknown model and 5 with a wrong key beside 5 good ones is 0% errors, 15 client errors."""
    for _ in range(5):
        chat(three)
    for _ in range(10):
        httpx.post(f"{three.base_url}/chat/completions", headers={"Authorization":
                   f"Bearer {CLIENT_KEY}"}, json={"model": "nope", "messages": []})
    for _ in range(5):
        httpx.post(f"{three.base_url}/chat/completions", headers={"Authorization": "Bearer x"},
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    status = httpx.get(f"{three.url}/status.json").json()

    assert status["summary"]["error_rate"] == 0.0
    assert status["summary"]["client_errors"] == 15
    assert sum(row["rps"] for row in status["series"]) * 10 == pytest.approx(5, abs=0.01)
    alpha = status["providers"][0]["traffic"]
    assert (alpha["answered"], alpha["failed"]) == (5, 0)
    assert alpha["ttft_p50_ms"] is not None


def chromium(url: str, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={workdir / 'chromium-profile'}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=90)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_the_page_renders_in_a_real_browser_and_shows_an_admin_disable(
        three: GatewayProcess, tmp_path: Path) -> None:
    chat(three)
    admin(three, "providers/beta/disable")

    page = chromium(f"{three.url}/", tmp_path, "--dump-dom")
    shot = tmp_path / "status.png"
    chromium(f"{three.url}/", tmp_path, f"--screenshot={shot}", "--window-size=412,915",
             "--hide-scrollbars")

    assert 'data-loaded="true"' in page.stdout, page.stderr[-2000:]
    order = re.findall(r'<li class="provider" data-name="(\w+)" data-health="(\w+)"',
                       page.stdout)
    # The enabled in the order they are tried, the disabled folded below them.
    assert order == [("alpha", "ok"), ("gamma", "ok"), ("beta", "disabled")]
    assert "disabled by an admin" in page.stdout
    assert re.search(r'class="stats">answered <b>1</b>', page.stdout), "per provider traffic"
    assert ":CONSOLE(" not in page.stderr, "the page logged to the console (an error?)"
    assert shot.exists() and shot.stat().st_size > 10_000


# Where the docs show the page; this test takes it, and rewrites it with UPDATE_SCREENSHOTS=1
# (else the picture goes to the test's own folder: a test run leaves the tree as it was).
SCREENSHOT = ROOT / "docs" / "status-page.png"
SPANS = (4.21, 59.96, 200.4, 7384.0)  # seconds, as a worker's for_s and load_s come


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_the_charts_have_axes_above_the_providers_and_the_disabled_are_folded(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    """Charts read at a glance (big, their scale and times labelled) before the provider cards;
    providers that are never tried fold into one closed group below those that are."""
    openai, anthropic, local = (upstream_factory(n) for n in ("openai", "anthropic", "local"))
    off = {"enabled": False}
    gateway = start_gateway(config({
        "openai": provider(openai.base_url, {"gpt-4o": "gpt-4o", "m": "gpt-4o-mini"}),
        "groq": provider(anthropic.base_url, {"m": "llama-3.3-70b"}, api_key="$NOT_SET_GROQ"),
        "anthropic": provider(anthropic.base_url, {"claude": "claude-sonnet-4", "m": "m"}),
        "local-vllm": provider(local.base_url, {"m": "qwen3-8b"}),
        "mistral": provider(local.base_url, {"m": "mistral-small"}, **off),
        "together": provider(local.base_url, {"m": "m"}, api_key="$NOT_SET_TOGETHER"),
        "fireworks": provider(local.base_url, {"m": "m"}, **off)},
        server={"api_keys": [CLIENT_KEY], "admin_keys": [KEY],
                "public_paths": ["/status.json"]}))
    for number in range(24):  # some tries fail over, and a few requests fail with nowhere to go
        openai.set_mode(answering(500) if number % 6 == 5 else ok())
        chat(gateway, "gpt-4o" if number % 8 == 7 else "m")
    admin(gateway, "providers/local-vllm/disable")

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(layout(gateway.url, port))

    assert seen["charts_first"] and seen["charts_bottom"] <= seen["providers_top"], seen
    assert seen["enabled"] == [["1.", "openai"], ["3.", "anthropic"]]
    assert seen["folded"] == [["2.", "groq"], ["4.", "local-vllm"], ["5.", "mistral"],
                              ["6.", "together"], ["7.", "fireworks"]]
    assert seen["summary"] == "5 disabled providers" and seen["open"] is False
    assert seen["folded_room"] < 1 and not seen["folded_seen"], "closed: no room, not seen"
    assert seen["opened_room"] > 300, "a click on the summary shows them"
    for name, chart in seen["charts"].items():
        assert chart["height"] >= 150, (name, chart)
        assert chart["min"] in ("0/s", "0%", "0 ms") and chart["max"] != chart["min"], chart
        assert len(chart["times"]) >= 4 and all(re.fullmatch(r"\d\d:\d\d", t)
                                                for t in chart["times"]), chart
    assert seen["charts"]["chart-rps"]["max"].endswith("/s")
    assert seen["charts"]["chart-errors"]["max"].endswith("%")
    assert seen["charts"]["chart-latency"]["lines"] == 2, "p50 and p99"
    assert seen["spans"] == [duration(s) for s in SPANS], "a worker's times worded as ls does"
    picture = base64.b64decode(seen["picture"])
    assert len(picture) > 10_000
    (tmp_path / "status-page.png").write_bytes(picture)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        SCREENSHOT.write_bytes(picture)


async def layout(url: str, port: int) -> dict[str, Any]:
    """Open the page at a desktop's width: where its parts are, what its charts say, and a
    picture of the whole page (PNG, base64)."""
    async with browser.open_page(port) as page:
        await page.send("Emulation.setDeviceMetricsOverride", width=900, height=1100,
                        deviceScaleFactor=1, mobile=False)
        await page.goto(f"{url}/")
        await page.wait_for("document.body.dataset.loaded === 'true' && "
                            "document.querySelectorAll('#chart-latency text.x').length > 0")
        cards = ("[...document.querySelectorAll('#ID li.provider')].map(li => "
                 "[li.querySelector('.order').textContent, li.dataset.name])")
        seen: dict[str, Any] = await page.evaluate("""(() => {
          const $ = (id) => document.getElementById(id);
          const charts = {};
          for (const svg of document.querySelectorAll('svg.chart')) {
            const said = (cls) => [...svg.querySelectorAll(`text.${cls}`)].map(t => t.textContent);
            charts[svg.id] = {height: svg.getBoundingClientRect().height, min: said('y-min')[0],
                              max: said('y-max')[0], times: said('x'),
                              lines: svg.querySelectorAll('polyline').length};
          }
          return {charts,
                  charts_first: Boolean($('charts').compareDocumentPosition($('providers'))
                                        & Node.DOCUMENT_POSITION_FOLLOWING),
                  charts_bottom: $('charts').getBoundingClientRect().bottom,
                  providers_top: $('providers').getBoundingClientRect().top,
                  summary: $('disabled-summary').textContent,
                  open: $('disabled-providers').open,
                  folded_room: $('disabled-providers').getBoundingClientRect().height
                               - $('disabled-summary').getBoundingClientRect().height,
                  folded_seen: $('disabled').querySelector('li').checkVisibility()};
        })()""")
        seen["enabled"] = await page.evaluate(cards.replace("ID", "providers"))
        seen["folded"] = await page.evaluate(cards.replace("ID", "disabled"))
        seen["spans"] = await page.evaluate(f"{list(SPANS)}.map(duration)")
        height = await page.evaluate("document.documentElement.scrollHeight")
        await page.send("Emulation.setDeviceMetricsOverride", width=900, height=height,
                        deviceScaleFactor=1, mobile=False)
        seen["picture"] = (await page.send("Page.captureScreenshot", format="png"))["data"]
        await page.click("#disabled-summary")
        seen["opened_room"] = await page.wait_for(
            "document.getElementById('disabled').querySelector('li').checkVisibility() && "
            "document.getElementById('disabled').getBoundingClientRect().height")
        return seen


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_with_keys_on_the_page_asks_for_one_says_when_it_is_wrong_and_goes_live_with_it(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    """Keys on, /status.json not public: the page says a key is needed (not "unreachable"),
    a wrong key is said to be wrong, a right one brings it live; the key stays in the tab."""
    up = upstream_factory("alpha")
    gateway = start_gateway(config({"alpha": provider(up.base_url, {"m": "m"})},
                                   server={"api_keys": [CLIENT_KEY], "admin_keys": [KEY]}))
    chat(gateway)

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(paste_keys(gateway.url, port))

    assert "This gateway needs a key" in seen["asked"], seen
    assert "unreachable" not in seen["meta_asked"]
    assert "That key was not accepted" in seen["wrong"] and "401" in seen["wrong"], seen
    assert seen["providers"] == [["alpha", "ok"]]
    assert "answered 1" in seen["stats"], seen
    assert seen["panel_hidden"] is True
    assert seen["kept"] == CLIENT_KEY, "in this tab's sessionStorage"
    assert CLIENT_KEY not in seen["href"] and "wrong-key" not in seen["href"]
    assert CLIENT_KEY not in gateway.logs()


async def paste_keys(url: str, port: int) -> dict[str, Any]:
    """Open the page, paste a wrong key then the right one; what the page showed each time."""
    async with browser.open_page(port) as page:
        await page.goto(f"{url}/")
        await page.wait_for("document.body.dataset.auth === 'needed'")
        seen: dict[str, Any] = {"asked": await page.text("#key-panel"),
                                "meta_asked": await page.text("#meta")}
        await page.type("#key", "wrong-key")
        await page.click("#key-form button")
        await page.wait_for("document.body.dataset.auth === 'rejected'")
        seen["wrong"] = await page.text("#key-panel")
        await page.type("#key", CLIENT_KEY)
        await page.click("#key-form button")
        await page.wait_for("document.body.dataset.loaded === 'true'")
        seen["providers"] = await page.evaluate(
            "[...document.querySelectorAll('li.provider')].map(li => [li.dataset.name, "
            "li.dataset.health])")
        seen["stats"] = await page.text("li.provider .stats")
        seen["panel_hidden"] = await page.evaluate("document.getElementById('key-panel').hidden")
        seen["kept"] = await page.evaluate("sessionStorage.getItem('llms-gateway-key')")
        seen["href"] = await page.evaluate("location.href")
        return seen


def test_a_warming_pool_and_a_full_gateway_are_counted_apart_from_failures(
        tmp_path: Path, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    """A pool still loading its model answers 503 model_loading, a gateway at its concurrency
    cap 503 overloaded: both say "wait", so /status.json counts them as not ready and shed,
    and the error rate of a healthy gateway stays 0%."""
    slow = upstream_factory("slow")
    slow.set_mode(slow_first_token(4.0))
    pool = {"type": "pool", "engine": "auto", "port": free_port(), "check_interval": 0.2,
            "models": {"qwen": {"source": "Qwen/Qwen3-8B", "max_model_len": 4096}}}
    doc = config({"local": pool, "slow": provider(slow.base_url, {"slow": "slow"},
                                                   timeouts={"first_token": 30})},
                 server={"max_concurrency": 1, "max_queue": 0})
    env = {**install_fakes(tmp_path / "bin", gpus=1), "FAKE_VLLM_LOAD_SECONDS": "120"}
    gateway = GatewayProcess(tmp_path, doc, env=env).start()
    try:
        loading = [ask(gateway, "qwen") for _ in range(3)]
        held: list[httpx.Response] = []
        holder = threading.Thread(target=lambda: held.append(ask(gateway, "slow")))
        holder.start()
        wait_until(lambda: status(gateway)["inflight"] == 1)
        shed = ask(gateway, "qwen")
        holder.join()
        wait_until(lambda: status(gateway)["summary"]["shed"] == 1)
        seen = status(gateway)
    finally:
        gateway.stop()

    assert [r.json()["error"]["code"] for r in loading] == ["model_loading"] * 3
    assert shed.status_code == 503 and shed.json()["error"]["code"] == "overloaded"
    assert [r.status_code for r in held] == [200]
    summary = seen["summary"]
    assert (summary["not_ready"], summary["shed"], summary["error_rate"]) == (3, 1, 0.0)
    assert all(row["error_rate"] == 0.0 for row in seen["series"])
    assert sum(row["rps"] for row in seen["series"]) * 10 == pytest.approx(1, abs=0.01)
    local = next(p for p in seen["providers"] if p["name"] == "local")
    assert (local["traffic"]["failed"], local["traffic"]["not_ready"]) == (0, 3)
    assert local["health"] == "ok"


def ask(gateway: GatewayProcess, model: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                      json={"model": model, "messages": MESSAGES})


def status(gateway: GatewayProcess) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{gateway.url}/status.json").json()
    return found


@pytest.fixture
def billed(start_gateway: Callable[..., GatewayProcess],
           upstream_factory: Callable[[str], FakeUpstream]) -> tuple[GatewayProcess, str, float]:
    """A priced gateway whose status is public, with a virtual key that spent 90% of its
    month's budget; the key's id and what it spent."""
    gateway = start_gateway(priced(upstream_factory("billing"), "m",
                                   server={"admin_keys": [KEY], "api_keys": [CLIENT_KEY],
                                           "public_paths": ["/status.json"]}))
    accounts = Admin(gateway, KEY)
    made = accounts.key(name="alice-laptop")
    spent = sum(float(teams_chat(gateway, made["key"]).headers["x-llms-cost"])
                for _ in range(2))
    changed = accounts.call("PATCH", f"/admin/keys/{made['id']}",
                            json={"budget": {"usd": spent / 0.9, "period": "month"}})
    assert changed.status_code == 200, changed.text
    return gateway, made["id"], spent


def test_status_json_shows_spend_and_the_database_to_a_reader_allowed_details(
        billed: tuple[GatewayProcess, str, float]) -> None:
    gateway, key_id, spent = billed

    seen = httpx.get(f"{gateway.url}/status.json",
                     headers={"Authorization": f"Bearer {KEY}"}).json()
    public = httpx.get(f"{gateway.url}/status.json").json()

    assert seen["database"]["up"] is True and seen["database"]["keys"] == 1
    spend = seen["spend"]
    assert spend["available"] is True
    assert spend["today"] == spend["month"] == {"requests": 2,
                                                "cost": pytest.approx(spent, abs=1e-9)}
    assert spend["top_keys"] == [{"key": key_id, "name": "alice-laptop", "requests": 2,
                                  "cost": pytest.approx(spent, abs=1e-9)}]
    [near] = spend["near_limit"]
    assert (near["scope"], near["name"], near["period"]) == ("key", key_id, "month")
    assert near["used"] == pytest.approx(0.9) and near["spent"] == pytest.approx(spent)
    assert "spend" not in public, "keys and dollars are details: a public reader sees none"
    assert public["database"]["up"] is True


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_the_spend_panel_shows_a_key_s_spend_and_its_budget_near_the_limit(
        billed: tuple[GatewayProcess, str, float], tmp_path: Path) -> None:
    gateway, key_id, spent = billed

    with browser.launched(tmp_path) as port:
        seen = asyncio.run(spend_panel(gateway.url, port))

    assert not seen["anonymous"], "the public page shows no spend"
    assert f"${spent:.4f}" in seen["today"] and "2 requests" in seen["today"]
    assert seen["top"] == [key_id]
    assert f"alice-laptop ({key_id}): ${spent:.4f}, 2 requests" in seen["top_text"]
    assert seen["near"] == [["key", key_id]]
    assert "90%" in seen["near_text"] and "per month" in seen["near_text"]


async def spend_panel(url: str, port: int) -> dict[str, Any]:
    """Open the public page, then paste the admin key; what the Spend panel showed."""
    async with browser.open_page(port) as page:
        await page.goto(f"{url}/")
        await page.wait_for("document.body.dataset.loaded === 'true'")
        seen: dict[str, Any] = {"anonymous": await page.evaluate(
            "document.querySelectorAll('#spend-top li[data-key]').length")}
        await page.evaluate(f"sessionStorage.setItem('llms-gateway-key', {KEY!r})")
        await page.wait_for("document.querySelectorAll('#spend-top li[data-key]').length")
        seen["today"] = await page.text("#spend-today")
        seen["today"] += " " + await page.text("#spend-today-requests")
        seen["top"] = await page.evaluate(
            "[...document.querySelectorAll('#spend-top li')].map(li => li.dataset.key)")
        seen["top_text"] = await page.text("#spend-top")
        seen["near"] = await page.evaluate(
            "[...document.querySelectorAll('#spend-near li')].map(li => [li.dataset.scope, "
            "li.dataset.name])")
        seen["near_text"] = await page.text("#spend-near")
        return seen


async def _connections_stopped() -> None:
    """aiosqlite stops a connection that failed to open without waiting: its thread ends by
    posting to this loop. Let it, before `asyncio.run` closes the loop (else it raises there,
    and pytest blames whichever test runs next)."""
    for thread in threading.enumerate():
        if "_connection_worker_thread" in thread.name:
            await asyncio.to_thread(thread.join, 10)


def test_the_spend_section_is_read_at_most_every_ten_seconds_and_says_when_it_cannot_be(
        tmp_path: Path) -> None:
    """Many tabs refreshing every two seconds cost the database one read per ten seconds; a
    database gone is said, and the page keeps its other sections."""
    path = tmp_path / "gateway.db"
    clock = [time.time()]
    accounts = Accounts(Database(f"sqlite:///{path}"), DatabaseConfig(),
                        lambda provider, alias: None, lambda alias, provider: None,
                        clock=lambda: clock[0])
    overview = Overview(accounts, clock=lambda: clock[0])

    def spent(cost: float) -> dict[str, Any]:
        return spend_row(time=clock[0], request_id="r", key_id="key_a", team=None, alias="m",
                         provider="p", upstream_model="m", endpoint="chat/completions",
                         prompt_tokens=3, completion_tokens=4, cached_tokens=0, cost=cost,
                         latency_ms=1.0, status=200)

    async def story() -> list[dict[str, Any]]:
        await accounts.start()
        await accounts.db.write_spend([spent(0.25)])
        seen = [await overview.view()]
        await accounts.db.write_spend([spent(0.5)])
        clock[0] += 9.9
        seen.append(await overview.view())  # kept
        clock[0] += 0.1
        seen.append(await overview.view())  # read again
        await accounts.db.close()
        path.unlink()
        path.mkdir()  # no database can be opened there
        clock[0] += 10
        seen.append(await overview.view())
        await accounts.db.close()
        await _connections_stopped()
        return seen

    first, kept, read, gone = asyncio.run(story())

    assert first["month"] == {"requests": 1, "cost": 0.25} and kept == first
    assert read["month"] == {"requests": 2, "cost": 0.75}
    assert read["top_keys"] == [{"key": "key_a", "name": None, "requests": 2, "cost": 0.75}]
    assert gone["available"] is False and "unavailable" in gone["error"]


def test_budgets_at_or_past_80_percent_are_listed_fullest_first() -> None:
    now = time.time()
    month, day = window("month", now)[0], window("day", now)[0]
    scopes = [Scope("key", "a", Budget(10.0, "month")), Scope("team", "t", Budget(1.0, "day")),
              Scope("key", "b", Budget(10.0, "month")), Scope("key", "z", Budget(0.0, "total"))]
    spent = {("key:a", month): 8.0, ("team:t", day): 1.5, ("key:b", month): 7.99}

    listed = near_limit(scopes, spent, now)

    assert [(r["scope"], r["name"], r["used"]) for r in listed] == [
        ("team", "t", 1.5), ("key", "z", 1.0), ("key", "a", 0.8)]
    assert listed[0]["resets_at"] is not None and listed[1]["resets_at"] is None


def test_the_page_names_its_charset_once(three: GatewayProcess) -> None:
    page = httpx.get(f"{three.url}/", timeout=10)

    assert page.status_code == 200
    assert page.headers.get_list("content-type") == ["text/html; charset=utf-8"]
