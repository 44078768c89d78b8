"""What users hit on day one: browser apps need CORS, clients written for vLLM or LiteLLM leave
out the /v1 prefix, and an unknown model should say which providers would serve it."""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.test_status_page import CHROMIUM, chromium
from tests.upstream import FakeUpstream

APP = "http://app.example"
KEY = "browser-key-0001"
HI = [{"role": "user", "content": "hi"}]


def test_a_browser_origin_gets_its_preflight_answered_and_cors_headers_on_every_answer(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})},
                                   server={"cors_origins": [APP]}))
    url = f"{gateway.base_url}/chat/completions"

    preflight = httpx.options(url, headers={
        "Origin": APP, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    answer = httpx.post(url, json={"model": "m", "messages": HI}, headers={"Origin": APP})
    error = httpx.post(url, json={"model": "nope", "messages": HI}, headers={"Origin": APP})
    with httpx.stream("POST", url, json={"model": "m", "messages": HI, "stream": True},
                      headers={"Origin": APP}) as stream:
        stream.read()
    stranger = httpx.post(url, json={"model": "m", "messages": HI},
                          headers={"Origin": "http://evil.example"})

    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == APP
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    for response in (answer, error, stream):
        assert response.headers["access-control-allow-origin"] == APP
        assert "x-llms-provider" in response.headers["access-control-expose-headers"]
    assert error.status_code == 404
    assert "access-control-allow-origin" not in stranger.headers


def test_without_cors_origins_no_cors_headers_are_sent(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))

    answer = httpx.post(f"{gateway.base_url}/chat/completions",
                        json={"model": "m", "messages": HI}, headers={"Origin": APP})

    assert "access-control-allow-origin" not in answer.headers


def test_the_relay_routes_answer_without_the_v1_prefix(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})}))

    chat = httpx.post(f"{gateway.url}/chat/completions", json={"model": "m", "messages": HI})
    legacy = httpx.post(f"{gateway.url}/completions", json={"model": "m", "prompt": "hi"})

    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    assert legacy.status_code == 200 and legacy.json()["object"] == "text_completion"


def test_an_unknown_model_names_the_disabled_providers_that_list_it_and_why(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    gateway = start_gateway(config({
        "local": provider(up.base_url, {"small": "s"}),
        "lilac": provider(up.base_url, {"kimi-k2.5": "k"}, api_key="$LILAC_API_KEY_UNSET"),
        "groq": provider(up.base_url, {"kimi-k2.5": "k"}, enabled=False),
    }))

    relayed = httpx.post(f"{gateway.base_url}/chat/completions",
                         json={"model": "kimi-k2.5", "messages": HI})
    listed = httpx.get(f"{gateway.base_url}/models/kimi-k2.5")

    for response in (relayed, listed):
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "lilac (LILAC_API_KEY_UNSET is not set)" in error["message"]
        assert "groq (disabled in config)" in error["message"]


PAGE = """<!doctype html><html><body><pre id="out">pending</pre><script>
fetch("%(gateway)s/v1/chat/completions", {method: "POST",
  headers: {"Content-Type": "application/json", "Authorization": "Bearer %(key)s"},
  body: JSON.stringify({model: "m", messages: [{role: "user", content: "hi"}]})})
  .then(r => r.json().then(j => { document.getElementById("out").textContent =
    "answered " + r.headers.get("x-llms-provider") + ": " + j.choices[0].message.content; }))
  .catch(e => { document.getElementById("out").textContent = "blocked: " + e; });
</script></body></html>"""


@contextlib.contextmanager
def page_server(root: Path) -> Iterator[str]:
    """A static web server for `root` on a port of its own: a web app's origin."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_a_web_app_on_an_allowed_origin_calls_the_gateway_from_a_real_browser(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream], tmp_path: Path) -> None:
    up = upstream_factory("up")
    allowed_root, other_root = tmp_path / "app", tmp_path / "other"
    with page_server(allowed_root) as app, page_server(other_root) as other:
        gateway = start_gateway(config({"up": provider(up.base_url, {"m": "m"})},
                                       server={"cors_origins": [app], "api_keys": [KEY]}))
        for root in (allowed_root, other_root):
            root.mkdir()
            (root / "index.html").write_text(PAGE % {"gateway": gateway.url, "key": KEY})

        allowed = chromium(f"{app}/index.html", tmp_path / "a", "--dump-dom")
        refused = chromium(f"{other}/index.html", tmp_path / "b", "--dump-dom")

    assert "answered up: Hello from up" in allowed.stdout, allowed.stderr[-2000:]
    assert "blocked: TypeError" in refused.stdout, refused.stderr[-2000:]
    assert len(up.requests) == 1, "the refused origin's preflight failed: nothing was relayed"
