"""``make ui-screenshot``'s browser step: headless Chromium writes a PNG of a page (skipped without Chromium)."""
from __future__ import annotations

import pytest

from flows.commands.ui_screenshot import browser, screenshot


def test_headless_chromium_writes_a_png(tmp_path):
    chrome = browser()
    if chrome is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium); `make ui-screenshot` needs it")
    page = tmp_path / "page.html"
    page.write_text("<h1>evaluate dense/sample: all 2 stages cached</h1>")
    out = tmp_path / "shot.png"
    screenshot(chrome, page.as_uri(), out, size="400,300")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
