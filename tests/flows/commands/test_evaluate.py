"""End-to-end: evaluate on small corpora, then the same run fully cached, then a grown corpus."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from flows.commands.evaluate import evaluate_flow
from tasks.data.ingest import IngestError
from tasks.data.sample import generate_sample
from tasks.core.store import Store
from tests.flows.conftest import make_config

SMALL_SAMPLE = ["dataset=sample", "dataset.n_passages=60", "dataset.n_questions=12"]


def events(tmp_path: Path, run_id: str) -> pd.DataFrame:
    return Store(tmp_path / "artifacts").events(run_id)


def write_hipporag(root: Path, corpus: list[dict], questions: list[dict]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.json").write_text(json.dumps(corpus))
    (root / "questions.json").write_text(json.dumps(questions))


def test_evaluate_then_fully_cached(tmp_path):
    cfg = make_config(tmp_path, "method=dense", *SMALL_SAMPLE)
    first = evaluate_flow(cfg, str(tmp_path / "run1"))
    for key in ["method", "dataset", "n_questions", "recall@2", "recall@5", "recall@10", "index_seconds",
                "query_ms_mean", "query_ms_p50", "query_ms_p95"]:
        assert key in first
    assert first["n_questions"] == 12 and 0 < first["recall@10"] <= 100
    assert first["recall@2"] <= first["recall@5"] <= first["recall@10"]
    assert json.loads((tmp_path / "run1" / "metrics.json").read_text())["recall@5"] == first["recall@5"]
    assert set(events(tmp_path, first["run_id"])["status"]) == {"computed"}

    second = evaluate_flow(cfg, str(tmp_path / "run2"))
    ev = events(tmp_path, second["run_id"])
    assert len(ev) > 0 and set(ev["status"]) == {"cached"}
    assert second["stages_computed"] == 0
    runs = Store(tmp_path / "artifacts").query("SELECT run_id, status, started_at, ended_at FROM runs")
    assert set(runs["run_id"]) == {first["run_id"], second["run_id"]} and set(runs["status"]) == {"completed"}
    assert (runs["ended_at"] >= runs["started_at"]).all()  # how each ended, from the flow's own hooks
    assert {k: second[k] for k in ["recall@2", "recall@5", "recall@10"]} == \
        {k: first[k] for k in ["recall@2", "recall@5", "recall@10"]}


def test_grown_corpus_recomputes_only_new_documents(tmp_path):
    corpus, questions = generate_sample(40, 8, seed=3)
    data = tmp_path / "data"
    base = ["method=zoomrag", "dataset=hipporag", "dataset.name=grow", f"data_dir={data}"]
    write_hipporag(data / "grow", corpus[:36], questions)
    first = evaluate_flow(make_config(tmp_path, *base), str(tmp_path / "r1"))
    write_hipporag(data / "grow", corpus, questions)
    second = evaluate_flow(make_config(tmp_path, *base), str(tmp_path / "r2"))
    ev = events(tmp_path, second["run_id"]).set_index("stage")
    assert ev.loc["ner", "rows_computed"] == 4
    assert ev.loc["chunk", "rows_computed"] == 4
    embeds = events(tmp_path, second["run_id"]).query("stage == 'embed'")["rows_computed"].tolist()
    assert embeds[0] == 4  # passages; sentences of the 4 new passages follow
    assert 4 <= embeds[1] < first["n_documents"]
    assert second["n_documents"] == 40 and first["n_documents"] == 36


def test_shrunk_corpus_drops_removed_documents(tmp_path):
    corpus, questions = generate_sample(40, 8, seed=4)
    data = tmp_path / "data"
    base = ["method=dense", "dataset=hipporag", "dataset.name=shrink", f"data_dir={data}"]
    write_hipporag(data / "shrink", corpus, questions)
    evaluate_flow(make_config(tmp_path, *base), str(tmp_path / "r1"))
    write_hipporag(data / "shrink", corpus[:30], questions)
    second = evaluate_flow(make_config(tmp_path, *base), str(tmp_path / "r2"))
    ev = events(tmp_path, second["run_id"]).set_index("stage")
    assert ev.loc["embed", "rows_computed"] == 0 and ev.loc["embed", "rows"] == 30
    hits = pd.read_parquet(tmp_path / "r2" / "hits.parquet")
    docs = pd.read_parquet(Store(tmp_path / "artifacts").query(
        "SELECT path FROM stages WHERE name = 'documents' ORDER BY created_at DESC LIMIT 1")["path"][0])
    assert set(hits["doc_id"]) <= set(docs["doc_id"])


def test_malformed_dataset_fails_clearly_and_writes_nothing(tmp_path):
    root = tmp_path / "data" / "bad"
    root.mkdir(parents=True)
    (root / "corpus.json").write_text(json.dumps([{"title": "A", "text": "x"}, {"title": "B"}]))
    cfg = make_config(tmp_path, "method=dense", "dataset=hipporag", "dataset.name=bad", f"data_dir={tmp_path / 'data'}")
    with pytest.raises(IngestError, match=r"corpus.json, record 1, field 'text': missing"):
        evaluate_flow(cfg, str(tmp_path / "r"))
    assert not list((tmp_path / "artifacts").rglob("*.parquet"))


def test_unknown_config_key_is_a_hydra_error(tmp_path):
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-m", "flows.commands.evaluate", "method.no_such_key=1",
                          f"artifacts_dir={tmp_path}"], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "no_such_key" in out.stderr and "Traceback" not in out.stderr


def test_update_of_a_non_erarag_method_reports_the_document_diff(tmp_path):
    from flows.commands.update import update_flow

    corpus, questions = generate_sample(40, 8, seed=5)
    data = tmp_path / "data"
    base = ["method=bm25", "dataset=hipporag", "dataset.name=diff", f"data_dir={data}"]
    write_hipporag(data / "diff", corpus[:30], questions)
    first = update_flow(make_config(tmp_path, *base))
    assert (first["added_docs"], first["removed_docs"]) == (30, 0)
    same = update_flow(make_config(tmp_path, *base))
    assert (same["added_docs"], same["removed_docs"], same["stages_computed"]) == (0, 0, 0)
    write_hipporag(data / "diff", corpus[5:], questions)
    moved = update_flow(make_config(tmp_path, *base))
    assert (moved["added_docs"], moved["removed_docs"]) == (10, 5)


def test_an_update_counts_documents_against_its_own_method_s_last_index(tmp_path):
    """dense updated first (its run ingests the grown corpus); bm25's index is still on the old corpus, so bm25's
    update reports the same change, not 0 / 0 against the ingest dense's run left behind."""
    from flows.commands.update import update_flow

    corpus, questions = generate_sample(40, 8, seed=5)
    data = tmp_path / "data"
    at = ["dataset=hipporag", "dataset.name=diff", f"data_dir={data}"]
    write_hipporag(data / "diff", corpus[:30], questions)
    for method in ("bm25", "dense"):
        update_flow(make_config(tmp_path, f"method={method}", *at))
    write_hipporag(data / "diff", corpus[5:], questions)
    dense = update_flow(make_config(tmp_path, "method=dense", *at))
    bm25 = update_flow(make_config(tmp_path, "method=bm25", *at))
    assert (dense["added_docs"], dense["removed_docs"]) == (10, 5)
    assert (bm25["added_docs"], bm25["removed_docs"]) == (10, 5) and bm25["stages_computed"] >= 1
