"""SeRAG end to end on the generated sample: index, tree statistics, retrieval, and a fully cached rerun."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from flows.evaluate import evaluate_flow
from flows.index import index_flow
from flows.update import update_flow
from tasks.core.sample import generate_sample
from tasks.core.store import Store
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


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("\n".join(json.dumps(r) for r in records))


def test_update_grows_the_graph_rows_of_new_chunks_and_rebuilds_the_tree(tmp_path):
    records, _ = generate_sample(60, 10, 0)
    corpus = tmp_path / "corpus.jsonl"
    cfg = make_config(tmp_path, "method=serag", "dataset=jsonl", f"dataset.path={corpus}", "dataset.name=grow")
    _write(corpus, records[:55])
    built = index_flow(cfg)
    _write(corpus, records)  # grown by 5 passages (5 whole-passage chunks)
    grown = update_flow(cfg)
    assert grown["mode"] == "update" and (grown["added_docs"], grown["removed_docs"]) == (5, 0)
    assert grown["graph_rows_computed"] == grown["added_chunks"] == 5 and grown["graph_rows_total"] == 60
    assert grown["tree_rebuilt"] and grown["tree_seconds"] > 0 and grown["graph_seconds"] > 0
    assert grown["communities_before"] > 1 and grown["communities_after"] > 1
    store = Store(tmp_path / "artifacts")
    ev = store.events(grown["run_id"]).set_index("stage")
    assert ev.loc["serag_graph", "rows_computed"] == 5 and ev.loc["serag_tree", "status"] == "computed"
    # not the full build's fingerprint: the grown graph's inputs name the graph it grew from

    def graph_row(path: str) -> pd.Series:
        return store.query("SELECT fp, input_fps FROM stages WHERE stage = 'serag_graph' AND path = ?",
                           [path]).iloc[0]

    assert json.loads(graph_row(grown["artifacts"]["W"])["input_fps"])["base"] == \
        graph_row(built["artifacts"]["W"])["fp"] == grown["base_fp"]
    full = index_flow(cfg)  # a full build of the same corpus is another artifact
    assert full["artifacts"]["W"] != grown["artifacts"]["W"]
    assert update_flow(cfg)["mode"] == "cached"  # nothing changed: the stored graph of this corpus is reused
