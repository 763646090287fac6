"""flows.evaluate with an LLM: the production client against a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import pandas as pd

from flows.evaluate import evaluate_flow
from tasks.answer_metrics import aggregate
from tasks.store import Store
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
