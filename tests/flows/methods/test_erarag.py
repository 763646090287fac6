"""method=erarag through the flows: evaluate on the sample, corpus updates with flows.commands.update
(selective re-summarisation, delete / re-insert equal to builds, stored hyperplanes reused), and
LLM summaries against a local HTTP server (a re-run costs zero calls)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from flows.commands.evaluate import evaluate_flow
from flows.runtime.pipeline import index_flow
from flows.commands.update import update_flow
from tasks.data.sample import generate_sample
from tasks.core.store import Store
from tasks.llm.params import LLMParams
from tasks.methods.erarag.params import EraParams
from tasks.methods.erarag.stages import read_meta
from tests.flows.conftest import make_config
from tests.llm_server import FakeLLMServer

SMALL = ["dataset=sample", "dataset.n_passages=60", "dataset.n_questions=10"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """One artifacts dir for the module: passage embeddings are computed once (row cache)."""
    return tmp_path_factory.mktemp("erarag")


def test_evaluate_reports_both_views_and_leaves_view_is_dense(shared, tmp_path):
    era = evaluate_flow(make_config(shared, "method=erarag", *SMALL), str(tmp_path / "era"))
    assert era["summariser"] == "extractive" and era["recall_view"] == "leaves"
    assert era["nodes_per_layer"] == [60, 6]  # 60 whole passages, segments of 8..12
    for k in (2, 5, 10):
        assert era[f"recall_leaves@{k}"] == era[f"recall@{k}"]
        assert 0 <= era[f"recall_expanded@{k}"] <= 100
    hits = pd.read_parquet(tmp_path / "era" / "hits.parquet")
    # at least the ranking depth (every one of the 60 passages, fewer than answer_in_context's depth) although
    # summaries rank high
    assert hits.groupby("qid").size().min() == min(60, make_config(shared, *SMALL)["eval"]["answer_depth"])
    # passages shorter than the window are single leaves embedded like dense: leaves view == dense
    evaluate_flow(make_config(shared, "method=dense", *SMALL), str(tmp_path / "dense"))
    dense = pd.read_parquet(tmp_path / "dense" / "hits.parquet")
    assert hits[["qid", "doc_id"]].equals(dense[["qid", "doc_id"]])
    trace = pd.read_parquet(tmp_path / "era" / "trace.parquet")
    for kept in trace["kept_chunks"]:  # Alg. 2 context: at most top_k nodes within the token budget
        kept = json.loads(kept)
        assert 1 <= len(kept) <= 10 and sum(len(t.split()) for t in kept) <= 2000
    expanded = evaluate_flow(make_config(shared, "method=erarag", "method.recall_view=expanded", *SMALL),
                             str(tmp_path / "exp"))
    assert expanded["stages_computed"] == 0  # the view is online only: every index stage is cached
    assert [expanded[f"recall@{k}"] for k in (2, 5, 10)] == [era[f"recall_expanded@{k}"] for k in (2, 5, 10)]


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("\n".join(json.dumps(r) for r in records))


def _nodes(out: dict) -> pd.DataFrame:
    return pq.read_table(out["artifacts"]["nodes"]).to_pandas()


def test_update_grow_shrink_regrow(shared, tmp_path):
    """``update_segmenting=rebuild``: every update equals a full build of the same corpus."""
    records, _ = generate_sample(60, 10, 0)  # the passages of SMALL: embeddings come from the row cache
    corpus = tmp_path / "corpus.jsonl"
    cfg = make_config(shared, "method=erarag", "dataset=jsonl", f"dataset.path={corpus}",
                      "method.update_segmenting=rebuild")
    _write(corpus, records[:57])
    base = update_flow(cfg)  # no stored hierarchy yet: a full build
    assert base["mode"] == "build" and base["added_docs"] == 57
    n57 = _nodes(base)
    planes = Path(base["hyperplanes"]).read_bytes()

    _write(corpus, records)  # grown by 3 passages
    grown = update_flow(cfg)
    assert grown["mode"] == "update" and (grown["added_docs"], grown["removed_docs"]) == (3, 0)
    layer1 = grown["per_layer"][1]
    assert 0 < layer1["segments_resummarised"] < layer1["segments_total"]  # only the affected segments
    assert grown["segments_resummarized"] == layer1["segments_resummarised"] < grown["segments_total"]
    n60 = _nodes(grown)
    old1 = set(n57.loc[n57["layer"] == 1, "node_id"])
    new1 = set(n60.loc[n60["layer"] == 1, "node_id"])
    assert len(new1 - old1) == layer1["segments_resummarised"] and old1 & new1  # untouched ones kept
    assert grown["hyperplanes"] == base["hyperplanes"] and Path(grown["hyperplanes"]).read_bytes() == planes
    assert grown["full_build_seconds_estimate"] > 0
    recorded = Store(shared / "artifacts").query("SELECT metrics FROM metrics WHERE kind = 'update'")
    assert json.loads(recorded["metrics"].iloc[-1])["per_layer"][1] == layer1

    # delete: the 57-passage graph is gone, so the update starts from the 60 one and removes 3
    Path(base["artifacts"]["nodes"]).unlink()
    _write(corpus, records[:57])
    shrunk = update_flow(cfg)
    assert shrunk["mode"] == "update" and (shrunk["added_docs"], shrunk["removed_docs"]) == (0, 3)
    assert _nodes(shrunk).equals(n57)  # same nodes, links, texts, codes and embeddings as the full build

    # re-insert, starting from the recomputed 57-passage graph: the same graph as the first update
    Path(grown["artifacts"]["nodes"]).unlink()
    _write(corpus, records)
    again = update_flow(cfg)
    assert again["mode"] == "update" and again["added_docs"] == 3 and _nodes(again).equals(n60)
    assert Path(again["hyperplanes"]).read_bytes() == planes

    cached = update_flow(cfg)  # nothing changed: nothing recomputed
    assert cached["mode"] == "cached" and cached["segments_resummarized"] == 0 and cached["added_docs"] == 0


def _hierarchy_inputs(store: Store, nodes_path: str) -> dict:
    return json.loads(store.query("SELECT input_fps FROM stages WHERE stage = 'erarag_hierarchy' AND path = ?",
                                  [nodes_path])["input_fps"].iloc[0])


def _hierarchy_status(store: Store, run_id: str) -> str:
    ev = store.events(run_id)
    return ev.loc[ev["stage"] == "erarag_hierarchy", "status"].iloc[0]


def test_local_update_keeps_segments_and_is_what_index_uses(tmp_path):
    """The default, Alg. 3: the stored segments are kept, the result names its base, and a later
    index (or evaluate) of the same corpus uses it; ``rebuild`` gives the build-equal graph beside it."""
    records, _ = generate_sample(60, 10, 0)
    corpus = tmp_path / "corpus.jsonl"
    cfg = make_config(tmp_path, "method=erarag", "dataset=jsonl", f"dataset.path={corpus}")
    _write(corpus, records[:58])
    base = update_flow(cfg)
    assert base["mode"] == "build"
    _write(corpus, records)
    grown = update_flow(cfg)
    assert grown["mode"] == "update" and grown["added_docs"] == 2
    store = Store(tmp_path / "artifacts")
    assert _hierarchy_inputs(store, grown["artifacts"]["nodes"])["base"] == \
        store.query("SELECT fp FROM stages WHERE path = ?", [base["artifacts"]["nodes"]])["fp"].iloc[0]
    assert read_meta(grown["artifacts"]["meta"])["update_segmenting"] == grown["update_segmenting"] == "local"
    old, new = _nodes(base), _nodes(grown)
    parent = new.set_index("node_id")["parent_id"]
    added = set(new.loc[new["layer"] == 0, "node_id"]) - set(old["node_id"])
    touched = set(parent[list(added)])
    kept = 0
    for seg in set(old.loc[old["layer"] == 1, "node_id"]):  # a segment no new passage joined is kept
        members = list(old.loc[old["parent_id"] == seg, "node_id"])
        if not touched & set(parent[members]):
            assert seg in set(new["node_id"])
            kept += 1
    assert kept >= 1
    indexed = index_flow(cfg)  # flows.commands.index of the same corpus uses the update as it is
    assert _hierarchy_status(store, indexed["run_id"]) == "cached"
    assert indexed["artifacts"]["nodes"] == grown["artifacts"]["nodes"]
    assert update_flow(cfg)["mode"] == "cached"
    rebuilt = update_flow(make_config(tmp_path, "method=erarag", "dataset=jsonl", f"dataset.path={corpus}",
                                      "method.update_segmenting=rebuild"))
    assert rebuilt["mode"] == "update" and rebuilt["update_segmenting"] == "rebuild"
    assert "base" not in _hierarchy_inputs(store, rebuilt["artifacts"]["nodes"])


def test_local_update_with_llm_summaries_calls_once_per_resummarised_segment(tmp_path):
    """With LLM summaries, a local update (Alg. 3) costs one LLM call per re-summarised segment, and its
    summary reports them; the segments no new passage reached keep their LLM text."""
    records, _ = generate_sample(60, 10, 0)
    corpus = tmp_path / "corpus.jsonl"
    with FakeLLMServer() as server:
        cfg = make_config(tmp_path, "method=erarag", "dataset=jsonl", f"dataset.path={corpus}", "llm=local",
                          f"llm.base_url={server.base_url}")
        _write(corpus, records[:58])
        base = update_flow(cfg)
        built = server.requests
        assert base["mode"] == "build" and base["llm_calls"] == built == base["segments_total"]
        _write(corpus, records)
        grown = update_flow(cfg)
        calls = server.requests - built
    assert grown["update_segmenting"] == "local" and grown["summariser"] == "llm"
    assert 0 < grown["segments_resummarized"] < grown["segments_total"]
    assert grown["llm_calls"] == calls == grown["segments_resummarized"]
    old, new = _nodes(base), _nodes(grown)
    kept = old.merge(new, on="node_id", suffixes=("_old", "_new"))
    kept = kept[kept["layer_old"] > 0]
    assert len(kept) and (kept["text_old"] == kept["text_new"]).all()


def test_update_of_other_methods_is_index(tmp_path):
    out = update_flow(make_config(tmp_path, "method=bm25", *SMALL))
    assert out["same_as"] == "flows.commands.index" and out["added_docs"] == 60 and out["segments_total"] is None


def test_llm_summaries_and_rerun_costs_no_calls(shared, tmp_path):
    with FakeLLMServer() as server:
        cfg = make_config(shared, "method=erarag", *SMALL, "llm=local", f"llm.base_url={server.base_url}")
        first = evaluate_flow(cfg, str(tmp_path / "r1"))
        assert first["summariser"] == "llm" and first["nodes_per_layer"] == [60, 6]
        store = Store(shared / "artifacts")
        metas = store.query("SELECT path, params FROM stages WHERE stage = 'erarag_hierarchy' AND name = 'meta'")
        llm_made = [r.path for r in metas.itertuples() if json.loads(r.params).get("llm_provider") == "local"]
        assert len(llm_made) == 1
        meta_path = llm_made[0]
        assert read_meta(meta_path)["summariser"] == "llm"
        nodes = pq.read_table(meta_path.replace("/meta-", "/nodes-")).to_pandas()
        summaries = nodes.loc[nodes["layer"] == 1, "text"]
        assert summaries.str.startswith("Echo: Summarise the passages below").all()  # the server's replies
        ledger = store.query("SELECT * FROM llm_ledger WHERE stage = 'erarag_summary'")
        assert ledger["llm_calls"].tolist() == [6] and ledger["prompt_tokens"].iloc[0] > 0
        served = server.requests
        second = evaluate_flow(cfg, str(tmp_path / "r2"))
        assert server.requests == served  # hierarchy cached, reader answers from the LLM cache
        assert second["recall@10"] == first["recall@10"]


def test_llm_summariser_without_llm_is_an_error():
    from types import SimpleNamespace

    from tasks.methods.erarag.params import LLMHierarchyParams, hierarchy_params
    from tasks.text.embed import EmbedderParams

    def params(method: EraParams, llm: LLMParams):
        return hierarchy_params(SimpleNamespace(method=method, embedder=EmbedderParams(), llm=llm))

    with pytest.raises(ValueError, match="needs an LLM"):
        params(EraParams(summariser="llm"), LLMParams())
    assert params(EraParams(), LLMParams()).kind == "extractive"
    llm = params(EraParams(), LLMParams(provider="local", model="m"))
    assert llm.kind == "llm" and isinstance(llm, LLMHierarchyParams) and llm.llm_model == "m"
    # an extractive hierarchy reads no LLM setting: an LLM configured for answers leaves it as it is
    assert params(EraParams(summariser="extractive"), LLMParams(provider="local", model="m")) == params(
        EraParams(summariser="extractive"), LLMParams())