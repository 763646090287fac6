"""The docs' stage diagrams render with the network off: mermaid is vendored from npm
(``docs/assets/javascripts/mermaid/``, loaded by ``mkdocs.yml``'s ``extra_javascript``), so a built method page
opened in headless Chromium that can reach nothing but the loopback address it is served from draws its diagram
as an SVG. The control: the same page with the vendored file blocked draws nothing (the CDN is unreachable)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.test_docs import REPO

VENDORED = REPO / "docs" / "assets" / "javascripts" / "mermaid"


def test_the_vendored_mermaid_is_the_npm_build_named_in_its_source_note():
    note = (VENDORED / "SOURCE.txt").read_text()
    want = re.search(r"mermaid\.min\.js sha256 ([0-9a-f]{64})", note).group(1)
    assert hashlib.sha256((VENDORED / "mermaid.min.js").read_bytes()).hexdigest() == want
    assert "MIT License" in (VENDORED / "LICENSE").read_text()
    version = re.search(r"mermaid@(\d+\.\d+\.\d+)", note).group(1)
    assert f'"{version}"' in (VENDORED / "mermaid.min.js").read_text(errors="replace")  # the bundle names its version


@contextlib.contextmanager
def loopback_site(root: Path) -> Iterator[str]:
    """A static file server over ``root`` on 127.0.0.1 (a thread); yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)


def svg_texts(node: dict, inside_mermaid: bool = False, inside_svg: bool = False) -> list[str]:
    """The text under every ``<svg>`` in a ``div.mermaid``'s shadow root (DOM.getDocument with pierce: mkdocs-material
    draws into a closed shadow root, which page scripts cannot see)."""
    attrs = dict(zip(node.get("attributes", [])[::2], node.get("attributes", [])[1::2]))
    mermaid = inside_mermaid or (node.get("nodeName") == "DIV" and "mermaid" in attrs.get("class", "").split())
    svg = inside_svg or (mermaid and node.get("nodeName", "").lower() == "svg")
    out = [node["nodeValue"]] if svg and node.get("nodeType") == 3 and node.get("nodeValue", "").strip() else []
    for child in [*node.get("children", []), *node.get("shadowRoots", [])]:
        out += svg_texts(child, mermaid, svg)
    return out


def test_a_method_page_draws_its_stage_diagram_offline(request):
    from tests.flows.cdp import OFFLINE, chromium, chromium_or_skip

    binary = chromium_or_skip()
    out, site = request.getfixturevalue("docs_site")  # the session's build (tests/conftest.py), once Chromium is here
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with loopback_site(site) as url:
        with chromium(binary, f"{url}/methods/zoomrag/", OFFLINE) as page:
            page.wait_for("!!document.querySelector('div.mermaid')")  # material swaps the block for a drawn one
            texts = svg_texts(page.send("DOM.getDocument", depth=-1, pierce=True)["root"])
            assert "ingest" in texts and any(t.startswith("chunk") for t in texts), texts
        with chromium(binary, f"{url}/", OFFLINE) as page:  # the control: no vendored file, no diagram
            page.send("Network.enable")
            page.send("Network.setBlockedURLs", urls=["*mermaid.min.js"])
            page.send("Page.navigate", url=f"{url}/methods/zoomrag/")
            page.wait_for("document.readyState === 'complete' && location.pathname.includes('zoomrag')")
            with pytest.raises(TimeoutError):
                page.wait_for("!!document.querySelector('div.mermaid')", timeout_s=5)
            assert svg_texts(page.send("DOM.getDocument", depth=-1, pierce=True)["root"]) == []
