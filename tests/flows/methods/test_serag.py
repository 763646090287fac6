"""SeRAG end to end on the generated sample: index, tree statistics, retrieval, and a fully cached rerun."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prefect import flow

import flows.methods.serag as serag_flow
import tasks.methods.serag.retriever as serag_retriever
from flows.runtime.config import load_config
from flows.commands.evaluate import evaluate_flow
from flows.runtime.pipeline import index_flow
from flows.runtime.pipeline import start_run
from flows.commands.update import update_flow
from tasks.data.ingest import ingest
from tasks.data.sample import generate_sample
from tasks.core.store import Store
from tasks.methods.serag import algorithm as se
from tasks.text.embed import encode_queries
from tasks.text.entities import query_entity_links
from tests.flows.conftest import copy_store, evaluated_store, make_config

SMALL = ["method=serag", "dataset.n_passages=80", "dataset.n_questions=16"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """SeRAG's default index evaluated once into a fresh store: the tests below work on copies of it."""
    return evaluated_store(tmp_path_factory, *SMALL)


def test_serag_end_to_end_then_fully_cached(built, tmp_path):
    root, first = built
    cfg = make_config(root, *SMALL)
    assert first["stages_computed"] > 0
    assert 0.0 < first["recall@10"] <= 100.0 and first["recall@2"] <= first["recall@5"] <= first["recall@10"]
    assert first["self_query"] is False and "WITHOUT self-query" in first["self_query_note"]
    tree = first["tree"]
    assert 1 < tree["n_communities"] <= 80 and tree["entropy_2d"] <= tree["entropy_1d"] + 1e-9
    assert first["graph"]["dist_nnz"] == 0  # whole-passage chunks: no two chunks share a document
    hits = pd.read_parquet(root / "run" / "hits.parquet")
    depth = max(10, cfg["eval"]["answer_depth"])  # evaluate ranks as deep as answer_in_context reads (< 80)
    assert hits.groupby("qid").size().max() == depth and not hits.duplicated(["qid", "doc_id"]).any()

    copy_store(root, tmp_path)  # the built store, copied: the second run must find all of it cached
    second = evaluate_flow(make_config(tmp_path, *SMALL), str(tmp_path / "b"))
    assert second["stages_computed"] == 0
    assert pd.read_parquet(tmp_path / "b" / "hits.parquet").equals(hits)


def test_ablations_single_layer_is_online_and_semantic_only_rebuilds_graph(built, tmp_path):
    copy_store(built[0], tmp_path)  # the default index, built
    single = evaluate_flow(make_config(tmp_path, *SMALL, "method.single_layer=true"), str(tmp_path / "b"))
    assert single["stages_computed"] == 0
    exact = evaluate_flow(make_config(tmp_path, *SMALL, "method.entity_sim=exact"), str(tmp_path / "e"))
    assert exact["stages_computed"] == 0 and exact["entity_sim"] == "exact"
    sem = evaluate_flow(make_config(tmp_path, *SMALL, "method.semantic_only=true"), str(tmp_path / "c"))
    assert sem["stages_computed"] == 3 and sem["graph"]["log_nnz"] == 0


def test_sentence_chunks_get_distance_edges_and_rank_passages(built, tmp_path):
    copy_store(built[0], tmp_path)  # its ingest, passage embeddings and NER are the default index's
    out = evaluate_flow(make_config(tmp_path, *SMALL, "method.chunk_unit=sentence"), str(tmp_path / "s"))
    assert out["n_chunks"] > 80 and out["graph"]["dist_nnz"] > 0
    hits = pd.read_parquet(tmp_path / "s" / "hits.parquet")
    depth = max(10, make_config(tmp_path, *SMALL)["eval"]["answer_depth"])
    assert hits.groupby("qid").size().max() == depth and not hits.duplicated(["qid", "doc_id"]).any()


def test_bonus_scope_leaves_passages_that_are_their_own_documents_as_they_are(built, tmp_path):
    # the sample's passages are each their own document (as every benchmark's): the document-scoped bonus (beyond
    # the paper, the default) shares nothing, so eq. 13 as printed ranks exactly the same, with nothing recomputed
    root, first = built
    assert first["bonus_scope"] == "passage"  # what ran: no document holds two passages
    copy_store(root, tmp_path)
    own = evaluate_flow(make_config(tmp_path, *SMALL, "method.bonus_scope=passage"), str(tmp_path / "p"))
    assert own["stages_computed"] == 0 and own["bonus_scope"] == "passage"
    assert pd.read_parquet(tmp_path / "p" / "hits.parquet").equals(pd.read_parquet(root / "run" / "hits.parquet"))


def test_without_community_term_and_entity_bonus_serag_is_dense(built, tmp_path):
    copy_store(built[0], tmp_path)
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
    again = index_flow(cfg)  # index (and evaluate) of this corpus use the graph the update grew for it
    assert again["artifacts"]["W"] == grown["artifacts"]["W"] and again["stages_computed"] == 0
    build = make_config(tmp_path, "method=serag", "dataset=jsonl", f"dataset.path={corpus}", "dataset.name=grow",
                        "method.reuse_updates=false")
    full = index_flow(build)  # a full build of the same corpus is another artifact
    assert full["artifacts"]["W"] != grown["artifacts"]["W"]
    assert update_flow(cfg)["mode"] == "cached"  # nothing changed: the stored graph of this corpus is reused


@flow(name="serag-test-online")
def _online(cfg: dict, questions: list[str], update: bool = False, probe=None):
    """Index (or update) inside a flow, then search ``questions`` with the retriever over that index:
    (document ids of the hits, index refs, data refs, and ``probe(retriever)`` if given)."""
    conf = load_config(cfg)
    ctx, _ = start_run(conf, "update" if update else "index")
    data = ingest(ctx, conf.dataset, conf.data_dir)
    index = (serag_flow.update if update else serag_flow.index)(ctx, data, conf)
    r = serag_flow.retriever(data, index, conf)
    hits = r.search(questions, 10)
    ids = [[r.doc_ids[d] for d in row if d >= 0] for row in hits.doc_idx]
    return ids, index, data, probe(r) if probe else None


def test_update_with_removed_documents_drops_their_chunks_from_graph_and_results(tmp_path):
    records, _ = generate_sample(60, 10, 0)
    corpus = tmp_path / "corpus.jsonl"
    cfg = make_config(tmp_path, "method=serag", "dataset=jsonl", f"dataset.path={corpus}", "dataset.name=shrink")
    removed = records[55:]
    # each removed passage's own text as a question: before the removal it is found first
    questions = [f"{r['title']}. {r['text']}" for r in removed]
    _write(corpus, records)
    before, index, data, _ = _online(cfg, questions)
    all_ids = Store.read(data["documents"], ["doc_id", "title"])
    gone = set(all_ids.loc[all_ids["title"].isin([r["title"] for r in removed]), "doc_id"])
    assert len(gone) == 5 and [row[0] for row in before] == \
        [all_ids.set_index("title").loc[r["title"], "doc_id"] for r in removed]
    assert gone <= set(Store.read(index["W_chunks"])["doc_id"])

    _write(corpus, records[:55])  # shrunk by 5 passages (5 whole-passage chunks)
    after, index, data, _ = _online(cfg, questions, update=True)
    meta = Store.read(index["W_meta"]).iloc[0]
    assert meta["mode"] == "update" and (meta["added_docs"], meta["removed_docs"]) == (0, 5)
    assert (meta["removed_chunks"], meta["rows_computed"], meta["n_chunks"]) == (5, 0, 55)
    chunks = Store.read(index["W_chunks"])
    assert len(chunks) == 55 and not gone & set(chunks["doc_id"])
    w = Store.read(index["W"])
    assert w[["row", "col"]].to_numpy().max() < 55  # no edge to a removed chunk's row
    for name in ("sem", "log"):  # every stored layer is over the 55 remaining chunks only
        layer = Store.read(index["W_layers"]).query("layer == @name")
        assert len(layer) and layer[["row", "col"]].to_numpy().max() < 55
    assert len(Store.read(index["community"])) == 55
    assert all(len(row) == 10 for row in after) and not gone & {d for row in after for d in row}
    assert set(Store.read(data["documents"])["doc_id"]) >= {d for row in after for d in row}


def test_query_entities_in_the_vocabulary_use_stored_embeddings_and_only_oov_names_are_encoded(tmp_path, monkeypatch):
    records, qs = generate_sample(80, 16, 0)
    corpus = tmp_path / "corpus.jsonl"
    _write(corpus, records)
    cfg = make_config(tmp_path, "method=serag", "dataset=jsonl", f"dataset.path={corpus}", "dataset.name=ents")
    questions = [q["question"] for q in qs] + ["Where was Zorblax Quintavian born, and did he study in Paris?",
                                              "Which company did Marguerite Okonkwo-Delacroix found in Vrellburg?"]
    calls: list[list[str]] = []

    def recording(texts, params):
        calls.append(list(texts))
        return encode_queries(texts, params)

    def probe(r):
        ner = r.recogniser.names(questions)
        links = query_entity_links(questions, r.vocab_index, r.max_words, ner)
        calls.clear()
        monkeypatch.setattr(serag_retriever, "encode_queries", recording)
        new = r.query_entity_sim(questions)
        monkeypatch.undo()
        # the former computation: every name (vocabulary or not) encoded online
        per_query = [list(dict.fromkeys([*n, *r.entity_names[ls].tolist()])) for n, ls in zip(ner, links)]
        owner = np.repeat(np.arange(len(questions)), [len(x) for x in per_query])
        old = se.query_entity_similarity(encode_queries([n for x in per_query for n in x], r.embedder), owner,
                                         r.entity_emb, len(questions), r.scoring.tau)
        oov = {n for x in ner for n in x if n not in r.vocab_index}
        return new, old, oov, set(r.vocab_index), sum(map(len, links))

    _, _, _, (new, old, oov, vocab, n_links) = _online(cfg, questions, probe=probe)
    assert n_links > 10 and {"zorblax quintavian", "vrellburg"} <= oov
    assert len(calls) == 1 and set(calls[0]) == oov and len(calls[0]) == len(oov)  # one batch, each once
    assert not vocab & set(calls[0])
    assert new.nnz == old.nnz > n_links // 2
    np.testing.assert_allclose(new.toarray(), old.toarray(), atol=1e-5)  # stored (torch) vs ONNX: ~1e-7


def test_passages_of_one_cut_document_share_its_entity_bonus(tmp_path):
    # three long records, each split into several passages, and short records that stay one passage each
    records, _ = generate_sample(45, 5, 0)
    long_docs = [{"title": f"manual {i}", "text": "\n\n".join(f"{r['title']}. {r['text']}" for r in records[i::3][:12])}
                 for i in range(3)]
    corpus = tmp_path / "corpus.jsonl"
    _write(corpus, long_docs + records[36:])
    cfg = make_config(tmp_path, "method=serag", "dataset=jsonl", f"dataset.path={corpus}", "dataset.name=cut")
    question = f"What does {records[0]['title']} do?"
    probe = lambda r: (r.bonus_groups, r.chunk_doc, r.run_stats()["bonus_scope"])  # noqa: E731
    ids, _, data, (groups, chunk_doc, scope) = _online(cfg, [question], probe=probe)
    docs = Store.read(data["documents"], ["doc_id", "document"])
    per_document = docs["document"].value_counts()
    assert len(docs) > 12 and (per_document > 1).sum() == 3  # the three long records were cut, the rest were not
    assert scope == "document" and len(ids[0]) == 10
    group, n_groups = groups
    source = docs["document"].to_numpy()[chunk_doc]  # each chunk's source document, from the stored lineage
    cut = np.isin(source, per_document.index[per_document > 1])
    assert n_groups == 3 + (~cut).sum()  # one group per cut document, every other chunk alone
    for doc in per_document.index[per_document > 1]:
        assert len(set(group[source == doc])) == 1
    assert len(set(group[~cut])) == (~cut).sum() and not set(group[~cut]) & set(group[cut])
