"""flows.commands.evaluate with an LLM: the production client against a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import pandas as pd

from flows.commands.evaluate import evaluate_flow
from tasks.core.store import Store
from tasks.eval.answer_metrics import aggregate
from tests.flows.conftest import make_config
from tests.llm_server import FakeLLMServer

SMALL = ["method=dense", "dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6"]


def test_evaluate_generates_answers_and_caches_llm_calls(tmp_path):
    with FakeLLMServer() as server:
        cfg = make_config(tmp_path, *SMALL, "llm=local", f"llm.base_url={server.base_url}")
        first = evaluate_flow(cfg, str(tmp_path / "r1"))
        n = first["n_questions"]
        assert first["llm_calls"] == n and first["llm_cache_hits"] == 0
        assert first["prompt_tokens"] > 0 and first["completion_tokens"] > 0
        preds = pd.read_parquet(tmp_path / "r1" / "predictions.parquet")
        questions = Store.read(Store(tmp_path / "artifacts").query(
            "SELECT path FROM stages WHERE name = 'questions'")["path"][0]).set_index("qid")
        expected = aggregate(preds["prediction"].tolist(), [list(questions.loc[q, "answers"]) for q in preds["qid"]])
        assert {k: first[k] for k in ["em", "f1", "contain_acc"]} == {k: round(v, 2) for k, v in expected.items()}
        served = server.requests

        second = evaluate_flow(cfg, str(tmp_path / "r2"))
        assert server.requests == served  # a re-run costs zero HTTP calls
        assert second["llm_calls"] == 0 and second["llm_cache_hits"] == n
        assert second["prompt_tokens"] == 0 and second["em"] == first["em"]
        ledger = Store(tmp_path / "artifacts").query("SELECT * FROM llm_ledger ORDER BY created_at")
        assert ledger["llm_calls"].tolist() == [n, 0]


def test_dry_run_estimates_without_calling(tmp_path):
    with FakeLLMServer() as server:
        cfg = make_config(tmp_path, *SMALL, "llm=local", f"llm.base_url={server.base_url}", "eval.llm_dry_run=true")
        out = evaluate_flow(cfg, str(tmp_path / "r"))
        assert server.requests == 0
        assert out["llm_dry_run"]["calls"] == out["n_questions"] and out["llm_dry_run"]["prompt_tokens"] > 0


def test_no_llm_skips_generation(tmp_path):
    out = evaluate_flow(make_config(tmp_path, *SMALL), str(tmp_path / "r"))
    assert "em" not in out and "recall@5" in out


def test_llm_ner_builds_the_graph_and_links_queries(tmp_path):
    """``ner=llm``: passages and questions go through the chat model; a re-run is free."""
    small = ["dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6", "eval.generate=false"]
    with FakeLLMServer() as server:
        llm = ["ner=llm", "llm=local", f"llm.base_url={server.base_url}"]
        for method in ["zoomrag", "linearrag"]:
            out = evaluate_flow(make_config(tmp_path, f"method={method}", *small, *llm), str(tmp_path / method))
            assert out["recall@5"] > 0
        store = Store(tmp_path / "artifacts")
        mentions = Store.read(store.query("SELECT path FROM stages WHERE stage = 'ner' AND name = 'mentions'")["path"][0])
        assert len(mentions) > 0 and set(mentions["label"]) <= {"ENTITY", "CARDINAL"}  # the LLM's spans, not spaCy's
        docs = Store.read(store.query("SELECT path FROM stages WHERE name = 'documents'")["path"][0])
        text = dict(zip(docs["doc_id"], docs["text"]))
        assert all(text[d][a:b] == s for d, s, a, b in mentions[["doc_id", "surface", "start", "end"]].itertuples(index=False))
        ledger = store.query("SELECT stage, sum(llm_calls) AS calls FROM llm_ledger GROUP BY stage ORDER BY stage")
        assert ledger.set_index("stage")["calls"].to_dict() == {"ner": 40, "query_ner": 6}  # linearrag reused both
        served = server.requests
        evaluate_flow(make_config(tmp_path, "method=linearrag", *small, *llm), str(tmp_path / "again"))
        assert server.requests == served  # passages and questions both come from the response cache


def test_index_dry_run_estimates_the_llm_stage_and_writes_nothing(tmp_path):
    """``eval.llm_dry_run``: the first LLM index stage reports its calls and tokens, sends nothing,
    writes nothing; the LLM-free stages before it are built (and cached) as usual."""
    small = ["dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6", "eval.llm_dry_run=true"]
    with FakeLLMServer() as server:
        llm = ["llm=local", f"llm.base_url={server.base_url}"]
        ner = evaluate_flow(make_config(tmp_path, "method=zoomrag", "ner=llm", *small, *llm), str(tmp_path / "a"))
        era = evaluate_flow(make_config(tmp_path, "method=erarag", "method.summariser=llm", *small, *llm),
                            str(tmp_path / "b"))
        assert server.requests == 0
    assert ner["stopped_at"] == "ner" and ner["llm_dry_run"]["ner"]["calls"] == 40
    assert ner["llm_dry_run"]["ner"]["prompt_tokens"] > 40 * 50  # the instructions alone are ~50 tokens
    est = era["llm_dry_run"][era["stopped_at"]]
    assert est["calls"] > 0 and est["completion_tokens"] > 0
    stages = set(Store(tmp_path / "artifacts").query("SELECT stage FROM stages")["stage"])
    assert "ner" not in stages and "erarag_hierarchy" not in stages
    assert {"chunk", "embed"} <= stages  # built before the LLM stage, no tokens needed
