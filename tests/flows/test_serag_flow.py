"""SeRAG end to end on the generated sample: index, tree statistics, retrieval, and a fully cached rerun."""
from __future__ import annotations

import pandas as pd

from flows.evaluate import evaluate_flow
from tests.flows.conftest import make_config

SMALL = ["method=serag", "dataset.n_passages=80", "dataset.n_questions=16"]


def test_serag_end_to_end_then_fully_cached(tmp_path):
    cfg = make_config(tmp_path, *SMALL)
    first = evaluate_flow(cfg, str(tmp_path / "a"))
    assert first["stages_computed"] > 0
    assert 0.0 < first["recall@10"] <= 100.0 and first["recall@2"] <= first["recall@5"] <= first["recall@10"]
    assert first["self_query"] is False and "WITHOUT self-query" in first["self_query_note"]
    tree = first["tree"]
    assert 1 < tree["n_communities"] <= 80 and tree["entropy_2d"] <= tree["entropy_1d"] + 1e-9
    assert first["graph"]["dist_nnz"] == 0  # whole-passage chunks: no two chunks share a document
    hits = pd.read_parquet(tmp_path / "a" / "hits.parquet")
    assert hits.groupby("qid").size().max() == 10 and not hits.duplicated(["qid", "doc_id"]).any()

    second = evaluate_flow(cfg, str(tmp_path / "b"))
    assert second["stages_computed"] == 0
    assert pd.read_parquet(tmp_path / "b" / "hits.parquet").equals(hits)


def test_ablations_single_layer_is_online_and_semantic_only_rebuilds_graph(tmp_path):
    evaluate_flow(make_config(tmp_path, *SMALL), str(tmp_path / "a"))
    single = evaluate_flow(make_config(tmp_path, *SMALL, "method.single_layer=true"), str(tmp_path / "b"))
    assert single["stages_computed"] == 0
    exact = evaluate_flow(make_config(tmp_path, *SMALL, "method.entity_sim=exact"), str(tmp_path / "e"))
    assert exact["stages_computed"] == 0 and exact["entity_sim"] == "exact"
    sem = evaluate_flow(make_config(tmp_path, *SMALL, "method.semantic_only=true"), str(tmp_path / "c"))
    assert sem["stages_computed"] == 3 and sem["graph"]["log_nnz"] == 0


def test_sentence_chunks_get_distance_edges_and_rank_passages(tmp_path):
    out = evaluate_flow(make_config(tmp_path, *SMALL, "method.chunk_unit=sentence"), str(tmp_path / "s"))
    assert out["n_chunks"] > 80 and out["graph"]["dist_nnz"] > 0
    hits = pd.read_parquet(tmp_path / "s" / "hits.parquet")
    assert hits.groupby("qid").size().max() == 10 and not hits.duplicated(["qid", "doc_id"]).any()


def test_without_community_term_and_entity_bonus_serag_is_dense(tmp_path):
    # single_layer drops eq. 10's community term; τ > 1 gates every entity out of eq. 12: S = γ_f cos(h_q, h_v)
    # over the same passage embeddings (title + text) dense searches, so the ranking is dense's
    base = ["dataset.n_passages=80", "dataset.n_questions=16"]
    evaluate_flow(make_config(tmp_path, "method=serag", *base, "method.single_layer=true", "method.tau=1.5"),
                  str(tmp_path / "s"))
    evaluate_flow(make_config(tmp_path, "method=dense", *base), str(tmp_path / "d"))
    s, d = (pd.read_parquet(tmp_path / x / "hits.parquet") for x in ("s", "d"))
    assert s["doc_id"].tolist() == d["doc_id"].tolist()
