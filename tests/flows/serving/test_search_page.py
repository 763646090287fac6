"""The search page in real headless Chromium: type a question, submit, and the ranked titles shown are
``/retrieve``'s; the page says which index is served and marks the question's linked names. A screenshot is
kept at ``artifacts/search-page.png``."""
from __future__ import annotations

import contextlib

import httpx

from flows.runtime.config import ServeParams
from flows.commands.evaluate import evaluate_flow
from flows.serving.app import Service
from flows.serving.index import open_index
from tasks.data.sample import generate_sample
from tests.flows.cdp import chromium, chromium_or_skip
from tests.flows.conftest import make_config
from tests.flows.serving_helpers import REPO, uvicorn_thread

SAMPLE = ["method=zoomrag", "dataset=sample", "dataset.n_passages=60", "dataset.n_questions=12"]
SCREENSHOT = REPO / "artifacts" / "search-page.png"


@contextlib.contextmanager
def searched(binary: str, index, question: str):
    """A real server over ``index`` and the page in headless Chromium after searching ``question``: yields the page
    and what ``/retrieve`` answers for the same question (k = 10)."""
    with uvicorn_thread(Service(index, ServeParams(), api_key=None)) as url:
        expected = httpx.post(f"{url}/retrieve", json={"question": question, "k": 10}).json()
        with chromium(binary, url + "/") as page:
            page.wait_for("document.getElementById('served').dataset.fingerprint")
            page.type("#q", question)
            page.click("#go")
            assert page.wait_for("document.body.dataset.done") == "1"
            yield page, expected


def test_search_page_shows_what_retrieve_returns(tmp_path):
    binary = chromium_or_skip()
    cfg = make_config(tmp_path, *SAMPLE)
    evaluate_flow(cfg, str(tmp_path / "run"))
    index = open_index(*SAMPLE, f"artifacts_dir={cfg['artifacts_dir']}")
    question = generate_sample(60, 12, 0)[1][0]["question"]
    with searched(binary, index, question) as (page, expected):
        titles = page.eval("[...document.querySelectorAll('li.passage .title')].map(e => e.textContent)")
        served = page.eval("document.getElementById('served').textContent")
        marks = page.eval("[...document.querySelectorAll('li.passage mark')].map(e => e.textContent)")
        page.screenshot(SCREENSHOT)
    assert titles == [p["title"] for p in expected["results"][0]] and len(titles) == 10
    assert index.info.fingerprint in served and "zoomrag" in served
    seeds = {s.lower() for s in expected["traces"][0].get("seed_entities", [])}
    assert marks and (not seeds or {m.lower() for m in marks} <= seeds)
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and SCREENSHOT.stat().st_size > 10_000


def test_search_page_shows_a_citation(tmp_path):
    """A folder's PDF and Markdown: the page shows each result's citation (file, page, heading path) as
    ``/retrieve`` gives it."""
    binary = chromium_or_skip()
    from flows.commands.update import update_flow
    from tests.flows.commands.test_own_documents import folder_overrides, write_folder

    root = tmp_path / "corpus"
    write_folder(root)
    overrides = ("method=bm25", *folder_overrides(root))
    cfg = make_config(tmp_path, *overrides)
    update_flow(cfg)
    index = open_index(config=cfg)
    question = "Which division should double its sales?"
    with searched(binary, index, question) as (page, expected):
        cites = page.eval("[...document.querySelectorAll('li.passage .cite')].map(e => e.textContent)")
    assert cites == [p["lineage"]["citation"] for p in expected["results"][0]]
    assert cites[0] == "report.pdf p. 2"
