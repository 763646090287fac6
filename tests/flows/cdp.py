"""A small driver for headless Chromium over the DevTools protocol (websockets): load a page, type, click,
read the DOM, take a screenshot. Enough for the search page's end-to-end test; no browser download."""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
from websockets.sync.client import connect

# the network off: every host name fails to resolve, and only the loopback address a test serves from is reached
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--proxy-server=127.0.0.1:9",
           "--proxy-bypass-list=127.0.0.1")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-extensions", "--hide-scrollbars",
         "--window-size=1280,1000", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def chromium_or_skip() -> str:
    """The headless Chromium binary on PATH; the calling test is skipped, with the reason, where there is none."""
    import pytest

    binary = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)),
                  None)
    if binary is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium; .ci/run installs it)")
    return binary


class Page:
    """One tab, driven by DevTools commands."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.ids = ws, itertools.count(1)

    def send(self, method: str, **params: Any) -> dict:
        call = next(self.ids)
        self.ws.send(json.dumps({"id": call, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == call:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def eval(self, expression: str) -> Any:
        out = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression!r}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"waited {timeout_s} s for {expression!r}")

    def click(self, selector: str) -> None:
        """A real mouse click at the element's centre."""
        box = self.eval(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                        f" return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        self.click(selector)
        self.send("Input.insertText", text=text)

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def chromium(binary: str, url: str, flags: tuple[str, ...] = ()) -> Iterator[Page]:
    """Headless Chromium on ``url`` (with ``flags`` beside :data:`FLAGS`); yields its first tab once the page has
    loaded."""
    with tempfile.TemporaryDirectory(prefix="dagrag-cdp-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([binary, *FLAGS, *flags, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.1)
            port = port_file.read_text().split()[0]
            tabs = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json() if t["type"] == "page"]
            with connect(tabs[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
                page = Page(ws)
                page.send("Page.enable")
                page.send("Page.navigate", url=url)
                page.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")
                yield page
        finally:  # the browser and its helper processes (renderer, GPU, zygote) go together
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
