"""evaluate reports evidence and context recall, and the dev/test split, on the sample dataset."""
from __future__ import annotations

import json

from flows.commands.evaluate import evaluate_flow
from tasks.core.store import Store
from tests.flows.conftest import make_config

SAMPLE = ["dataset=sample", "dataset.n_passages=80", "dataset.n_questions=16"]


def test_evaluate_reports_evidence_context_and_splits(tmp_path):
    m = evaluate_flow(make_config(tmp_path, "method=bm25", *SAMPLE), str(tmp_path / "run"))
    assert m["evidence_units"] == "passage sentences" and m["n_questions_with_sentences"] == 16
    ev = [m[f"evidence_recall@{k}"] for k in (2, 5, 10)]
    assert 0 < ev[0] <= ev[1] <= ev[2] <= 100
    # five short sample passages always fit the reader's budget: the context is exactly the top 5
    assert m["context_recall"] == m["recall@5"]
    assert m["dev"]["n_questions"] == m["test"]["n_questions"] == 8
    assert {"recall@5", "evidence_recall@5", "context_recall"} <= set(m["dev"])
    store = Store(tmp_path / "artifacts")
    stored = json.loads(store.query("SELECT metrics FROM metrics")["metrics"][0])
    assert stored["evidence_recall@5"] == m["evidence_recall@5"] and stored["test"] == m["test"]
    sentences = store.query("SELECT count(*) AS n FROM gold_sentences")["n"][0]  # the stage's view
    assert sentences >= 16
