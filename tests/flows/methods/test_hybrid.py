"""Hybrid (RRF of dense and BM25) end to end on a small generated sample: it indexes nothing once dense and
bm25 are built, and with weights (1, 0) its ranking is dense's."""
from __future__ import annotations

import pandas as pd

from flows.commands.evaluate import evaluate_flow
from tasks.core.store import Store
from tests.flows.conftest import make_config

SMALL = ["dataset.n_passages=80", "dataset.n_questions=16"]


def ranking(run_dir) -> dict[str, list[str]]:
    hits = pd.read_parquet(run_dir / "hits.parquet").sort_values(["qid", "rank"])
    return hits.groupby("qid", sort=True)["doc_id"].agg(list).to_dict()


def test_hybrid_reuses_dense_and_bm25_indexes_and_reduces_to_dense(tmp_path):
    dense = evaluate_flow(make_config(tmp_path, "method=dense", *SMALL), str(tmp_path / "dense"))
    bm25 = evaluate_flow(make_config(tmp_path, "method=bm25", *SMALL), str(tmp_path / "bm25"))
    hybrid = evaluate_flow(make_config(tmp_path, "method=hybrid", *SMALL), str(tmp_path / "hybrid"))

    events = Store(tmp_path / "artifacts").events(hybrid["run_id"])
    assert {"embed", "bm25_index"} <= set(events["stage"]) and set(events["status"]) == {"cached"}
    assert hybrid["stages_computed"] == 0
    assert hybrid["n_questions"] == 16 and hybrid["recall@2"] <= hybrid["recall@5"] <= hybrid["recall@10"]
    assert hybrid["recall@10"] >= min(dense["recall@10"], bm25["recall@10"])
    fused = pd.read_parquet(tmp_path / "hybrid" / "hits.parquet")
    depth = max(10, make_config(tmp_path, *SMALL)["eval"]["answer_depth"])  # evaluate's ranking depth (< 80)
    assert fused.groupby("qid").size().eq(depth).all()
    assert fused.groupby("qid")["score"].apply(lambda s: s.is_monotonic_decreasing).all()
    latency = pd.read_parquet(tmp_path / "hybrid" / "latency.parquet")
    assert {"query_encoding_ms", "dense_search_ms", "bm25_search_ms", "fusion_ms"} <= set(latency.columns)

    only_dense = evaluate_flow(make_config(tmp_path, "method=hybrid", "method.bm25_weight=0", *SMALL),
                               str(tmp_path / "only_dense"))
    assert ranking(tmp_path / "only_dense") == ranking(tmp_path / "dense")
    assert {k: only_dense[k] for k in ("recall@2", "recall@5", "recall@10")} == \
        {k: dense[k] for k in ("recall@2", "recall@5", "recall@10")}
