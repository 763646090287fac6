"""LinearRAG end to end on a small generated sample: index stages, trace, fallback counter, recall vs dense."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from flows.commands.evaluate import evaluate_flow
from tasks.core.store import Store
from tests.flows.conftest import copy_store, make_config

SMALL = ["dataset.n_passages=60", "dataset.n_questions=12"]
BEYOND = ["linearrag", "zoomrag", "serag"]  # the methods the beyond_paper experiment runs on the gazetteer graph


@pytest.fixture(scope="module")
def beyond(tmp_path_factory):
    """One store holding the beyond_paper index of each method in BEYOND on the sample (its ingest, NER and
    passage embeddings shared with the paper's): ``(root, {method: metrics})``. The tests below work on copies."""
    root = tmp_path_factory.mktemp("beyond")
    return root, {method: evaluate_flow(make_config(root, f"method={method}", "experiment=beyond_paper", *SMALL),
                                        str(root / method)) for method in BEYOND}


def test_linearrag_small_sample_end_to_end(beyond, tmp_path):
    copy_store(beyond[0], tmp_path)
    lin = evaluate_flow(make_config(tmp_path, "method=linearrag", *SMALL), str(tmp_path / "lin"))
    dense = evaluate_flow(make_config(tmp_path, "method=dense", *SMALL), str(tmp_path / "dense"))
    assert lin["n_questions"] == 12 and lin["recall@2"] <= lin["recall@5"] <= lin["recall@10"]
    assert lin["recall@10"] >= dense["recall@10"]
    assert lin["n_sentences"] > lin["n_documents"] == 60 and lin["n_entities"] > 0
    assert lin["passage_reset"] == "auto -> eq7"  # the sample's passages are their own documents: eq. (7)

    stages = Store(tmp_path / "artifacts").events(lin["run_id"])["stage"].tolist()
    assert stages.count("embed") == 3  # passages, sentences, entity strings
    assert {"ner", "chunk", "entity_graph", "entity_texts"} <= set(stages)

    trace = pd.read_parquet(tmp_path / "lin" / "trace.parquet")
    assert len(trace) == 12
    fallback = 0
    for row in trace.itertuples():
        top, scores = json.loads(row.top_passages), json.loads(row.top_scores)
        # evaluate ranks as deep as answer_in_context reads (eval.answer_depth), here every one of the 60 passages
        assert len(top) == min(60, make_config(tmp_path, *SMALL)["eval"]["answer_depth"])
        assert scores == sorted(scores, reverse=True)
        seeds, activated = json.loads(row.seeds), json.loads(row.activated)
        fallback += row.dense_fallback
        assert row.dense_fallback == (not seeds)
        assert len(activated) <= 2  # max_iterations = 3 tiers, the seeds being the first
    assert lin["dense_fallback_queries"] == fallback

    latency = pd.read_parquet(tmp_path / "lin" / "latency.parquet")
    assert {"query_ner_ms", "query_encoding_ms", "bridging_ms", "ppr_ms"} <= set(latency.columns)


def test_beyond_paper_experiment_runs_each_method_on_the_gazetteer_graph(beyond):
    root, runs = beyond
    for method in BEYOND:
        m = runs[method]
        assert m["n_questions"] == 12 and m["recall@2"] <= m["recall@5"] <= m["recall@10"]
        stages = set(Store(root / "artifacts").events(m["run_id"])["stage"])
        assert "linked_entity_graph" in stages and "entity_graph" not in stages


def test_title_walk_with_the_papers_question_linking_runs(beyond, tmp_path):
    """The title walk needs titles as nodes (graph_linking), not the gazetteer on questions."""
    copy_store(beyond[0], tmp_path)
    m = evaluate_flow(make_config(tmp_path, "method=linearrag", "method.graph_linking=gazetteer",
                                  "method.title_edge_weight=50", "method.passage_reset=top_similarity", *SMALL),
                      str(tmp_path / "walk"))
    assert m["n_questions"] == 12 and m["recall@2"] <= m["recall@5"] <= m["recall@10"]


def test_lowercase_name_weight_runs_on_the_stored_graph(beyond, tmp_path):
    """The lever re-weights the walk's edges when the retriever loads: the index built for the preset is reused."""
    copy_store(beyond[0], tmp_path)  # the preset's index of each method, built
    for method in ["linearrag", "zoomrag"]:
        base = [f"method={method}", "experiment=beyond_paper", *SMALL]
        m = evaluate_flow(make_config(tmp_path, *base, "method.lowercase_name_weight=0.1"), str(tmp_path / f"{method}-b"))
        assert m["stages_computed"] == 0 and m["n_questions"] == 12


def test_masked_relation_gate_shares_zoomrags_relation_sentences_and_changes_the_ppr(beyond, tmp_path):
    """LinearRAG's gate walks per-query transitions; its masked sentences are the stage ZoomRAG computed."""
    copy_store(beyond[0], tmp_path)
    gate = ["experiment=beyond_paper", *SMALL, "method.relation_gate_temperature=0.2",
            "method.relation_gate_masked=true"]
    zoom = evaluate_flow(make_config(tmp_path, "method=zoomrag", *gate), str(tmp_path / "zoom"))
    assert "relation_sentences" in zoom["index_stage_seconds"]
    plain = evaluate_flow(make_config(tmp_path, "method=linearrag", *gate[:-2], "method.relation_gate_temperature=0"),
                          str(tmp_path / "plain"))
    gated = evaluate_flow(make_config(tmp_path, "method=linearrag", *gate), str(tmp_path / "gated"))
    assert gated["stages_computed"] == 0  # the sentences, graph and masked embeddings are shared
    a, b = (pd.read_parquet(tmp_path / r / "hits.parquet") for r in ("plain", "gated"))
    assert plain["n_questions"] == gated["n_questions"] == 12
    assert (a["score"] - b["score"]).abs().max() > 1e-6
    with pytest.raises(Exception, match="ppr_sweeps=alternating"):
        evaluate_flow(make_config(tmp_path, "method=linearrag", *gate, "method.ppr_sweeps=power"), str(tmp_path / "bad"))


def test_second_hop_runs_on_the_stored_index_and_counts_its_rounds(beyond, tmp_path):
    """The second hop (beyond the paper) re-ranks at query time: the preset's index is reused, each question's
    rounds are traced, and the parsed reading (spaCy's parse of the question) runs too."""
    copy_store(beyond[0], tmp_path)
    base = ["method=linearrag", "experiment=beyond_paper", *SMALL]
    off = evaluate_flow(make_config(tmp_path, *base, "method.second_hop_weight=0"), str(tmp_path / "off"))
    hops = {}
    for query in ("masked", "parsed"):
        run = f"hop-{query}"
        hops[query] = evaluate_flow(make_config(tmp_path, *base, "method.second_hop_weight=0.2",
                                                "method.second_hop_rounds=3", f"method.second_hop_query={query}"),
                                    str(tmp_path / run))
        assert hops[query]["stages_computed"] == 0 and hops[query]["n_questions"] == 12
        trace = pd.read_parquet(tmp_path / run / "trace.parquet")
        assert trace["second_hop_rounds"].between(1, 3).all()
        assert hops[query]["second_hop_rounds_per_query"] == pytest.approx(trace["second_hop_rounds"].mean(), abs=1e-3)
    assert off["second_hop_rounds_per_query"] == 0
    a, b = (pd.read_parquet(tmp_path / r / "hits.parquet") for r in ("off", "hop-masked"))
    assert not a[["qid", "doc_id", "rank"]].equals(b[["qid", "doc_id", "rank"]])
    with pytest.raises(Exception, match="graph_linking=gazetteer"):
        evaluate_flow(make_config(tmp_path, "method=linearrag", *SMALL, "method.second_hop_weight=0.2"),
                      str(tmp_path / "bad"))
