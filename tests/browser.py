"""Headless Chromium driven over the DevTools protocol, for tests that use a page as a person
does: type into a field, press a button, read what the page then shows.

The protocol is JSON over one WebSocket (aiohttp's client, already a dependency); Chromium says
its port in `DevToolsActivePort` in its profile, so nothing parses its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: commands go out with an id, and the answer with that id comes back."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one protocol command; its result (events meanwhile are passed over)."""
        number = next(self._ids)
        await self._socket.send_json({"id": number, "method": method, "params": params})
        async for message in self._socket:
            said = json.loads(message.data)
            if said.get("id") == number:
                if "error" in said:
                    raise AssertionError(f"{method}: {said['error']}")
                result: dict[str, Any] = said.get("result") or {}
                return result
        raise AssertionError("Chromium closed the DevTools connection")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.send("Runtime.evaluate", expression=expression,
                                 returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def wait_for(self, expression: str, within: float = 30.0) -> Any:
        """The expression's value once it is truthy (the page polls and renders on its own)."""
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(AssertionError):  # the page may be mid-navigation
                if value := await self.evaluate(expression):
                    return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"never true within {within}s: {expression}")

    async def type(self, selector: str, text: str) -> None:
        """Focus the field and put `text` in it as a paste or an input method does."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", text=text)

    async def click(self, selector: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    async def text(self, selector: str) -> str:
        """What a person reads in the element (hidden parts excluded)."""
        return str(await self.evaluate(
            f"document.querySelector({json.dumps(selector)}).innerText"))


@contextlib.contextmanager
def launched(workdir: Path) -> Iterator[int]:
    """A fresh headless Chromium with a profile in `workdir`; its DevTools port."""
    assert CHROMIUM is not None
    profile = workdir / "chromium-profile"
    browser = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield _devtools_port(profile / "DevToolsActivePort", browser)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(browser.pid, signal.SIGTERM)  # the browser and its renderers
        browser.wait(timeout=30)


@contextlib.asynccontextmanager
async def open_page(port: int) -> AsyncIterator[Page]:
    """The one tab of the Chromium listening for DevTools on `port`."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/json/list") as answer:
            targets = await answer.json()
        tab = next(t for t in targets if t["type"] == "page")
        async with session.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            yield Page(ws)


def _devtools_port(path: Path, browser: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if browser.poll() is not None:
            raise AssertionError(f"chromium exited with {browser.returncode}")
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):  # mid-write
            return int(path.read_text().split()[0])
        time.sleep(0.05)
    raise AssertionError("chromium did not open its DevTools port")
