"""Your own documents end to end: a mixed folder (Markdown, HTML, a PDF written by fpdf2, text) and long JSONL
records through ``evaluate``, the Python API, ``query``'s output and HTTP ``/retrieve`` with citations and
``group=document``; a folder that gains, changes, loses and renames files; bad files with ``dataset.on_error``."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from flows.commands.evaluate import evaluate_flow
from flows.commands.query import render_text
from flows.commands.update import update_flow
from flows.runtime.config import ServeParams
from flows.serving.app import Service
from flows.serving.index import open_index
from tasks.core.store import Store
from tasks.data.ingest import IngestError
from tasks.data.readers import read_document
from tests.flows.conftest import make_config
from tests.flows.serving_helpers import REPO, uvicorn_thread
from tests.flows.test_runners import count_submissions  # noqa: F401 - the fixture counting Dask submissions
from tests.tasks.data.test_readers import fpdf_bytes, scanned_pdf_bytes

GUIDE = ("# Guide\n\nThis guide covers the frobnicator tool.\n\n## Install\n\n### Linux\n\n"
         + "On Linux the frobnicator installs from the package archive with apt-get install frobnicator. " * 12
         + "\n\n## Usage\n\n" + "Call frobnicate with a config file to reticulate splines. " * 12 + "\n")
PAGE = ("<html><body><nav>Home | About | Contact</nav><main><h1>Wombat care</h1><h2>Feeding</h2>"
        + "<p>Wombats eat grasses, roots and bark; feed them fresh hay every evening.</p>" * 6
        + "<h2>Housing</h2>" + "<p>A wombat burrow needs dry soil and a deep tunnel.</p>" * 6
        + "</main><footer>(c) boilerplate</footer></body></html>")
REPORT = ["Annual report. Revenue grew in the first quarter thanks to tapir exports. " * 6,
          "Outlook. The board expects the capybara division to double its sales next year. " * 6]


def write_folder(root: Path) -> None:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "guide.md").write_text(GUIDE, encoding="utf-8")
    (root / "wombats.html").write_text(PAGE, encoding="utf-8")
    (root / "report.pdf").write_bytes(fpdf_bytes(REPORT))
    (root / "note.txt").write_text("A short note: the office cat is named Pixel.\n", encoding="utf-8")


def write_questions(path: Path) -> None:
    qs = [("q1", "How do I install the frobnicator on Linux?", "apt-get", "guide"),
          ("q2", "What do wombats eat?", "hay", "wombats"),
          ("q3", "Which division should double its sales?", "capybara", "report"),
          ("q4", "What is the office cat called?", "Pixel", "note")]
    path.write_text("\n".join(json.dumps({"_id": i, "question": q, "answer": a, "supporting_facts": [[t, 0]]})
                              for i, q, a, t in qs), encoding="utf-8")


def folder_overrides(root: Path, *more: str) -> tuple[str, ...]:
    return ("dataset=folder", "dataset.name=own", f"dataset.path={root}", "dataset.split.max_tokens=64",
            "dataset.split.overlap=8", *more)


def documents(cfg: dict, run_id: str) -> tuple:
    store = Store(cfg["artifacts_dir"])
    fps = store.query("SELECT fp FROM stage_events WHERE run_id = ? AND stage = 'ingest'", [run_id])["fp"]
    refs = store.lookup("ingest", fps.iloc[0])
    return (Store.read(refs["documents"]), Store.read(refs["sources"]), Store.read(refs["skipped"]),
            store.events(run_id).set_index("stage"))


def test_mixed_folder_cites_its_sources_through_every_interface(tmp_path):
    root = tmp_path / "corpus"
    write_folder(root)
    write_questions(tmp_path / "questions.jsonl")
    overrides = ("method=dense", *folder_overrides(root, f"dataset.questions={tmp_path / 'questions.jsonl'}"))
    cfg = make_config(tmp_path, *overrides)
    metrics = evaluate_flow(cfg, str(tmp_path / "run"))
    assert metrics["n_questions"] == 4 and metrics["recall@5"] == 100.0

    docs, sources, skipped, _ = documents(cfg, metrics["run_id"])
    assert sorted(sources["source"]) == ["docs/guide.md", "note.txt", "report.pdf", "wombats.html"]
    assert skipped.empty and metrics["n_documents"] == len(docs) > len(sources)  # long files were split
    fmt = {".md": "markdown", ".html": "html", ".pdf": "pdf", ".txt": "text"}
    for source, group in docs.groupby("source"):
        path = root / source
        text = read_document(path.read_bytes(), fmt[path.suffix]).text
        for row in group.itertuples():  # lineage: the span cut from the document is the passage
            assert text[row.char_start:row.char_end] == row.text
    assert set(docs[docs.source == "report.pdf"]["page"]) == {1, 2}
    assert ["Guide", "Install", "Linux"] in docs[docs.source == "docs/guide.md"]["headings"].map(list).tolist()
    assert not docs["text"].str.contains("boilerplate|Contact").any()

    index = open_index(config=cfg)
    ranked = index.retrieve(["Which division should double its sales?", "How do I install the frobnicator?"], 4,
                            group="document")
    assert ranked[0][0].lineage["citation"] == "report.pdf p. 2"
    assert ranked[1].documents[0]["source"] == "docs/guide.md"
    assert any(p.lineage["citation"].startswith("docs/guide.md § Guide › Install") for p in ranked[1])
    shown = render_text(1, ranked[0], 40)
    assert "report.pdf p. 2" in shown

    with uvicorn_thread(Service(index, ServeParams(), api_key=None)) as url:
        body = httpx.post(f"{url}/retrieve", json={"question": "What do wombats eat?", "k": 4,
                                                    "group": "document"}).json()
        bad = httpx.post(f"{url}/retrieve", json={"question": "x", "group": "chapter"})
    top = body["results"][0][0]
    assert top["lineage"]["source"] == "wombats.html" and top["lineage"]["headings"][:1] == ["Wombat care"]
    assert body["documents"][0][0]["source"] == "wombats.html"
    assert [p["doc_id"] for d in body["documents"][0] for p in d["passages"]] and bad.status_code == 422


def test_long_jsonl_records_are_split_and_scored_by_document(tmp_path):
    records = [{"title": "Manual", "text": GUIDE, "version": 3},
               {"title": "Zoo", "text": "Wombats eat grasses and hay. " * 60, "version": 1}]
    corpus = tmp_path / "c.jsonl"
    corpus.write_bytes(b"\xef\xbb\xbf" + "\n".join(json.dumps(r) for r in records).encode())
    qs = tmp_path / "q.jsonl"
    qs.write_text(json.dumps({"_id": "a", "question": "How is the frobnicator installed on Linux?",
                              "answer": "apt-get", "supporting_facts": [["Manual", 0]]}), encoding="utf-8")
    cfg = make_config(tmp_path, "method=bm25", "dataset=jsonl", "dataset.name=long", f"dataset.path={corpus}",
                      f"dataset.questions={qs}", "dataset.split.max_tokens=64")
    metrics = evaluate_flow(cfg, str(tmp_path / "run"))
    docs, sources, _, _ = documents(cfg, metrics["run_id"])
    assert sources["source"].tolist() == ["c.jsonl#0", "c.jsonl#1"]
    assert json.loads(sources["metadata"].iloc[0]) == {"version": 3} and len(docs) > 4
    assert metrics["recall@2"] == 100.0  # gold names the document; a hit on any of its passages counts


def test_folder_update_add_edit_delete_rename(tmp_path):
    root = tmp_path / "corpus"
    write_folder(root)
    overrides = ("method=dense", *folder_overrides(root))
    first = update_flow(make_config(tmp_path, *overrides))
    before, _, _, _ = documents(make_config(tmp_path, *overrides), first["run_id"])

    (root / "new.md").write_text("# Otters\n\nOtters hold hands while they sleep.\n", encoding="utf-8")  # add
    (root / "docs" / "guide.md").write_text(GUIDE + "\n## Removal\n\nRun apt-get purge frobnicator.\n")  # edit
    (root / "note.txt").unlink()  # delete
    (root / "wombats.html").rename(root / "marsupials.html")  # rename: same bytes, new path and title
    cfg = make_config(tmp_path, *overrides)
    second = update_flow(cfg)
    docs, sources, _, events = documents(cfg, second["run_id"])
    assert sorted(sources["source"]) == ["docs/guide.md", "marsupials.html", "new.md", "report.pdf"]
    assert events.loc["read", "rows_computed"] == 2  # the added and the edited file; the renamed one's bytes are known
    assert "note.txt" not in set(docs["source"]) and second["removed_docs"] > 0 and second["added_docs"] > 0
    embedded = int(events.loc["embed", "rows_computed"])
    assert 0 < embedded < len(docs)  # only passages whose text (with title) is new
    unchanged = before[before.source == "report.pdf"]["doc_id"].tolist()
    assert set(unchanged) <= set(docs["doc_id"])
    index = open_index(config=cfg)
    assert index.retrieve("Do otters hold hands?", 1)[0][0].lineage["source"] == "new.md"


def test_bad_files_fail_by_name_or_are_skipped_and_reported(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "good.md").write_text("# Fine\n\nA readable file about herons.\n", encoding="utf-8")
    (root / "locked.pdf").write_bytes(fpdf_bytes(["secret"], password="pw"))
    (root / "broken.pdf").write_bytes(fpdf_bytes(["fine"])[:300])
    (root / "scan.pdf").write_bytes(scanned_pdf_bytes())
    (root / "blob.txt").write_bytes(bytes(range(256)) * 8)
    base = ("method=bm25", "dataset=folder", "dataset.name=bad", f"dataset.path={root}")
    cfg = make_config(tmp_path, *base)
    with pytest.raises(IngestError, match=r"corpus: blob.txt: binary file .*; 3 more file\(s\) .*dataset.on_error=skip"):
        update_flow(cfg)
    store = Store(cfg["artifacts_dir"])
    assert store.query("SELECT count(*) AS n FROM stages WHERE stage = 'ingest'")["n"].iloc[0] == 0  # nothing half-written
    assert not list(Path(cfg["artifacts_dir"]).glob("**/*.tmp*"))

    from flows.runtime.observe import observed

    skip = make_config(tmp_path, *base, "dataset.on_error=skip")
    done = observed(update_flow, skip)(skip)
    _, sources, skipped, _ = documents(skip, done["run_id"])
    assert sources["source"].tolist() == ["good.md"]
    reasons = dict(zip(skipped["source"], skipped["reason"]))
    assert set(reasons) == {"locked.pdf", "broken.pdf", "scan.pdf", "blob.txt"}
    assert "encrypted" in reasons["locked.pdf"] and "no text layer" in reasons["scan.pdf"]
    assert "binary" in reasons["blob.txt"] and "corrupt" in reasons["broken.pdf"]
    assert "locked.pdf" in asyncio.run(_artifact("skipped-files"))

    out = subprocess.run([sys.executable, "-m", "flows.cli", "index", *base, "dataset.on_error=skip",
                          f"artifacts_dir={tmp_path / 'cli'}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    [report] = (tmp_path / "cli" / "runs").glob("*/*/skipped_files.json")
    assert {s["source"] for s in json.loads(report.read_text())["skipped"]} == set(reasons)


async def _artifact(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        arts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return "\n".join(str(a.data) for a in arts)


def test_reading_is_partitioned_on_dask_and_equals_threads(tmp_path, count_submissions):
    pytest.importorskip("prefect_dask")
    from flows.runtime.config import with_runner
    from flows.runtime.pipeline import index_flow

    root = tmp_path / "corpus"
    write_folder(root)
    base = ("method=bm25", *folder_overrides(root), "runner.partition_rows=2")
    thread = make_config(tmp_path / "thread", *base, "runner=thread")
    dask = make_config(tmp_path / "dask", *base, "runner=dask", "runner.n_workers=2")
    a = with_runner(index_flow, thread)(thread)
    b = with_runner(index_flow, dask)(dask)
    assert b["rows_computed"]["read"] == 4 and len(count_submissions) >= 2  # 4 files in partitions of 2
    for table in (0, 1):  # documents and sources: the same rows, in the same order
        assert documents(thread, a["run_id"])[table].equals(documents(dask, b["run_id"])[table])
