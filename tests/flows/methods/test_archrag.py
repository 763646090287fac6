"""ArchRAG end to end on the generated sample: LLM-free index and retrieval, every Table 4 ablation, the
paper's full path against a real local OpenAI-compatible server (a rerun costs zero calls), and growth."""
from __future__ import annotations

import json
from typing import Any

import pandas as pd
import pytest

from flows.runtime.config import ConfigError, load_config
from flows.commands.evaluate import evaluate_flow
from flows.commands.update import update_flow
from tasks.data.sample import generate_sample
from tasks.core.store import Store
from tasks.methods.archrag.filtering import FILTER_SYSTEM, MERGE_SYSTEM
from tests.flows.conftest import copy_store, evaluated_store, make_config
from tests.llm_server import FakeLLMServer
from tests.tasks.methods.archrag.test_kg_stages import extraction_reply

SMALL = ["method=archrag", "dataset.n_passages=80", "dataset.n_questions=16", "method.min_clusters=3"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The default LLM-free ArchRAG evaluated once into a fresh store: the tests below work on copies of it."""
    return evaluated_store(tmp_path_factory, *SMALL)


def test_archrag_llm_free_end_to_end_then_fully_cached(built, tmp_path):
    root, first = built
    cfg = make_config(root, *SMALL)
    assert first["kg_builder"] == "cooccur" and first["summariser"] == "extractive"
    assert first["layers"] >= 2 and first["layers_searched"] == list(range(first["layers"]))
    assert 0.0 < first["recall@10"] <= 100.0 and first["recall@2"] <= first["recall@5"] <= first["recall@10"]
    assert "harness" in first["passage_rule"]
    hits = pd.read_parquet(root / "run" / "hits.parquet")
    depth = max(10, cfg["eval"]["answer_depth"])  # evaluate ranks as deep as answer_in_context reads
    assert not hits.duplicated(["qid", "doc_id"]).any() and hits.groupby("qid").size().max() <= depth
    trace = pd.read_parquet(root / "run" / "trace.parquet")
    retrieved = [json.loads(r) for r in trace["retrieved"]]
    assert all(len(r) == first["layers"] and len(r[0]) == 5 for r in retrieved)
    # the reader's context: 5 entity descriptions, the relations among them, 5 community reports per layer above
    for r, kept, docs in zip(retrieved, trace["kept_chunks"].map(json.loads), trace["context_docs"].map(json.loads)):
        assert len(kept) == len(docs) >= sum(len(x) for x in r) and all(docs[:5])
    assert 0.0 <= first["context_recall"] <= 100.0 and first["answer_in_context_n"] > 0
    assert all(0.0 <= first[f"answer_in_context@{b}"] <= 100.0 for b in (1000, 2000, 4000))
    row = Store(cfg["artifacts_dir"]).query("SELECT params FROM stages WHERE stage = 'archrag_kg_cooccur'")
    assert json.loads(row["params"].iloc[0])["builder"] == "cooccur"  # the catalog says which builder ran

    copy_store(root, tmp_path)  # the built store, copied: the second run must find all of it cached
    second = evaluate_flow(make_config(tmp_path, *SMALL), str(tmp_path / "b"))
    assert second["stages_computed"] == 0
    assert pd.read_parquet(tmp_path / "b" / "hits.parquet").equals(hits)


ABLATIONS = {  # Table 4 variant -> overrides, and the stages it recomputes over the default index
    "Spec.": (["method.clustering=spectral"], {"archrag_hierarchy", "archrag_chnsw"}),
    "Spec. (No Aug)": (["method.clustering=spectral", "method.augment=false"], {"archrag_hierarchy", "archrag_chnsw"}),
    "Leiden": (["method.augment=false", "method.attribute_weights=false"], {"archrag_hierarchy", "archrag_chnsw"}),
    "Single-Layer": (["method.max_level=1"], {"archrag_hierarchy", "archrag_chnsw"}),
    "Entity-Only": (["method.entity_only=true"], set()),
    # the C-HNSW stage stores ef_search and exact (flat layers) and the retriever searches with them: rebuilt
    "exact search": (["method.exact_search=true"], {"archrag_chnsw"}),
}


def test_table4_ablations_run_and_rebuild_only_what_they_change(built, tmp_path):
    root, base = built
    copy_store(root, tmp_path)  # the default index, built: each variant recomputes only what it changes
    for name, (overrides, rebuilt) in ABLATIONS.items():
        cfg = make_config(tmp_path, *SMALL, *overrides)
        out = evaluate_flow(cfg, str(tmp_path / name.replace(" ", "_")))
        ev = Store(cfg["artifacts_dir"]).events(out["run_id"])
        assert set(ev.loc[ev["status"] == "computed", "stage"]) == rebuilt, name
        assert out["recall@10"] > 0, name
    assert out["layers_searched"] == base["layers_searched"]  # exact search: same layers, brute force
    single = json.loads((tmp_path / "Single-Layer" / "metrics.json").read_text())
    entity = json.loads((tmp_path / "Entity-Only" / "metrics.json").read_text())
    assert single["layers"] == 2 and entity["layers_searched"] == [0]
    graph, exact = (pd.read_parquet(run / "trace.parquet")["retrieved"] for run in (root / "run", tmp_path / "exact_search"))
    assert sum(a == b for a, b in zip(graph, exact)) >= 0.9 * len(graph)  # C-HNSW ~ brute force per layer


def test_the_old_passage_rule_and_the_authors_topk_chunk(tmp_path):
    base = evaluate_flow(make_config(tmp_path, *SMALL, "method.passage_rule=entity_rank"), str(tmp_path / "base"))
    old = evaluate_flow(make_config(tmp_path, *SMALL, "method.passage_rule=similarity_sum"), str(tmp_path / "old"))
    assert old["stages_computed"] == 0 and "similarity_sum" in old["passage_rule"]  # an online switch
    assert old["context_recall"] == base["context_recall"]  # the rule ranks passages; the context is the items'
    cfg = make_config(tmp_path, *SMALL, "method.passage_rule=entity_rank", "method.topk_chunk=3")
    chunk = evaluate_flow(cfg, str(tmp_path / "chunk"))
    ev = Store(cfg["artifacts_dir"]).events(chunk["run_id"])
    assert set(ev.loc[ev["status"] == "computed", "stage"]) == {"embed"}  # the passages' dense index, alone
    trace = pd.read_parquet(tmp_path / "chunk" / "trace.parquet")
    hits = pd.read_parquet(tmp_path / "chunk" / "hits.parquet")
    base_trace = pd.read_parquet(tmp_path / "base" / "trace.parquet")
    for qid, kept, docs, before in zip(trace["qid"], trace["kept_chunks"].map(json.loads),
                                       trace["context_docs"].map(json.loads), base_trace["kept_chunks"].map(json.loads)):
        assert kept[:-3] == before and all(len(d) == 1 for d in docs[-3:])  # three passages after the items
        assert {d[0] for d in docs[-3:]} <= set(hits.loc[hits["qid"] == qid, "doc_id"])  # and in the ranking
    # the default, auto, on passages that are their own documents: entity_rank's hits, the passages embedded beside
    auto = evaluate_flow(make_config(tmp_path, *SMALL), str(tmp_path / "auto"))
    assert auto["passage_rule"].endswith("auto -> entity_rank") and "source_passages_median" not in auto
    assert pd.read_parquet(tmp_path / "auto" / "hits.parquet").equals(pd.read_parquet(tmp_path / "base" / "hits.parquet"))


def test_kg_llm_without_an_llm_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match="kg=llm"):
        load_config(make_config(tmp_path, *SMALL, "kg=llm"))


# ----------------------------------------------------------------------------- the paper's path, with an LLM


def responder(body: dict[str, Any]) -> str:
    """A deterministic model for every ArchRAG prompt: extraction, description merge, community report,
    filter points, merge answer."""
    system = body["messages"][0]["content"]
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if user.startswith("Passage:\n"):
        return extraction_reply(user.split("Passage:\n", 1)[1])
    if "\nDescriptions:\n" in user:
        return f"Merged: {user.splitlines()[0]}"
    if system.startswith("You write short reports"):
        first = user.split("\n")[1] if "\n" in user else user
        return json.dumps({"title": f"Group of {first[:30]}", "summary": f"About {first[:60]}", "rating": 7,
                           "findings": [{"summary": first[:40], "explanation": "given"}]})
    if system == FILTER_SYSTEM:
        return json.dumps({"points": [{"description": "a point from the records", "score": 60}]})
    if system == MERGE_SYSTEM:
        return "The points say so.\nAnswer: yes"
    return "Answer: unknown"


def test_paper_path_with_an_llm_then_zero_calls_on_rerun(tmp_path):
    with FakeLLMServer(responder=responder) as server:
        llm = ["llm=local", f"llm.base_url={server.base_url}", "llm.model=fake", "kg=llm"]
        cfg = make_config(tmp_path, *SMALL, "dataset.n_passages=30", "dataset.n_questions=6", *llm)
        dry = evaluate_flow(make_config(tmp_path, *SMALL, "dataset.n_passages=30", "dataset.n_questions=6", *llm,
                                        "eval.llm_dry_run=true"), str(tmp_path / "dry"))
        assert dry["stopped_at"] == "archrag_extract" and dry["llm_dry_run"]["archrag_extract"]["calls"] > 0
        assert server.requests == 0  # the estimate sends nothing
        first = evaluate_flow(cfg, str(tmp_path / "a"))
        assert first["kg_builder"] == "llm" and first["summariser"] == "llm" and first["generation"] == "filter"
        assert {"em", "f1", "contain_acc", "accuracy", "recall"} <= set(first)
        assert first["gen_filter_calls"] >= 6 and first["gen_merge_calls"] == 6 and first["gen_filter_failures"] == 0
        paths = Store(cfg["artifacts_dir"]).query("SELECT path FROM stages WHERE stage = 'archrag_hierarchy' "
                                                  "AND name = 'communities'")["path"]
        comm = pd.read_parquet(paths.iloc[0])
        assert len(comm) > 0 and (comm["source"] == "llm").all()  # every community got an LLM report
        requests = server.requests
        assert requests > 0

        again = evaluate_flow(cfg, str(tmp_path / "b"))
        assert server.requests == requests  # a re-run costs zero calls
        assert again["stages_computed"] == 0 and again["llm_calls"] == 0 and again["llm_cache_hits"] > 0
        assert again["accuracy"] == first["accuracy"]

        direct = evaluate_flow(make_config(tmp_path, *SMALL, "dataset.n_passages=30", "dataset.n_questions=6", *llm,
                                           "method.generation=direct"), str(tmp_path / "d"))
        assert direct["generation"] == "direct" and direct["gen_direct_calls"] == 6


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_growth_recomputes_communities_and_reuses_unchanged_summaries(tmp_path):
    records, _ = generate_sample(80, 10, 0)
    corpus = tmp_path / "corpus.jsonl"
    cfg = make_config(tmp_path, "method=archrag", "method.min_clusters=3", "dataset=jsonl", f"dataset.path={corpus}",
                      "dataset.name=grow")
    _write(corpus, records[:70])
    built = update_flow(cfg)
    _write(corpus, records)  # grown by 10 passages
    grown = update_flow(cfg)
    assert grown["communities_recomputed"] is True
    assert 0 < grown["segments_resummarized"] < grown["segments_total"]  # unchanged communities kept theirs
    assert grown["rows_computed_by_stage"]["ner"] == 10 and grown["rows_computed_by_stage"]["chunk"] == 10
    assert built["segments_resummarized"] == built["segments_total"]
    same = update_flow(cfg)
    assert same["communities_recomputed"] is False and same["segments_resummarized"] == 0


def test_long_documents_rank_the_sources_of_the_kg_chunks(tmp_path):
    """On documents cut into several passages, ``auto`` is ``source_relevance`` with sources by chunk (beyond the
    paper); ``source_unit=passage`` is an online switch whose sources are a subset, so its cosines rank no higher."""
    records, questions = generate_sample(40, 8, 0)
    book = {r["title"]: f"Book {i // 10}" for i, r in enumerate(records)}
    filler = "this paragraph names nothing at all and only fills the page between two others " * 4
    docs = [{"title": f"Book {b}", "text": "\n\n".join([r["text"] for r in records[b * 10:b * 10 + 5]] + [filler]
                                                        + [r["text"] for r in records[b * 10 + 5:(b + 1) * 10]])}
            for b in range(4)]  # each book holds a passage that names no entity: no item's own source
    corpus, qfile = tmp_path / "corpus.jsonl", tmp_path / "questions.json"
    _write(corpus, docs)
    qfile.write_text(json.dumps([{**q, "supporting_facts": [[book[t], 0] for t, _ in q["supporting_facts"]]}
                                 for q in questions]))
    base = ["method=archrag", "method.min_clusters=3", "dataset=jsonl", f"dataset.path={corpus}",
            f"dataset.questions={qfile}", "dataset.split.max_tokens=48", "dataset.split.overlap=8"]
    chunk = evaluate_flow(make_config(tmp_path, *base), str(tmp_path / "chunk"))
    assert chunk["n_documents"] > 4  # documents were cut into passages
    assert chunk["passage_rule"].endswith("auto -> source_relevance") and chunk["source_unit"] == "chunk"
    own = evaluate_flow(make_config(tmp_path, *base, "method.source_unit=passage"), str(tmp_path / "own"))
    assert own["stages_computed"] == 0 and own["source_unit"] == "passage"
    assert chunk["source_passages_median"] >= own["source_passages_median"]
    wide, narrow = (pd.read_parquet(tmp_path / r / "hits.parquet") for r in ("chunk", "own"))
    for qid, mine in narrow.groupby("qid"):
        theirs = wide.loc[wide["qid"] == qid].sort_values("rank")["score"].to_numpy()
        mine = mine.sort_values("rank")["score"].to_numpy()
        assert len(theirs) >= len(mine) and (theirs[:len(mine)] >= mine - 1e-6).all()
    assert chunk["source_passages_share"] > own["source_passages_share"]  # a chunk reaches passages naming no item
