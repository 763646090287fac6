"""Tests for ``tasks.eval.spans``: span_hit@k, span_in_context@B, doc_recall@k, result size."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.eval.answer_context import answer_in_context
from tasks.eval.spans import (document_recall, gold_documents, passage_lineage, result_size, span_hit_at_k,
                              span_in_context, span_rows)
from tasks.llm.generate import contexts_for

DOC_A = "".join(f"sentence {i:03d} of document A. " for i in range(200))  # 6,000 characters
DOC_B = "".join(f"line {i:03d} of document B. " for i in range(100))


def split(doc: str, doc_name: str, size: int) -> list[dict]:
    """Passages of ``size`` characters with their lineage (what h58a's splitter records)."""
    return [{"doc_id": f"{doc_name}-{s}", "title": doc_name, "text": doc[s:s + size], "document": doc_name,
             "char_start": s, "char_end": min(s + size, len(doc))} for s in range(0, len(doc), size)]


@pytest.fixture
def corpus() -> pd.DataFrame:
    return pd.DataFrame(split(DOC_A, "A", 1000) + split(DOC_B, "B", 1000))


def hits_of(rows: list[tuple[str, str]]) -> pd.DataFrame:
    """(qid, doc_id) in rank order per question → hits."""
    frame = pd.DataFrame(rows, columns=["qid", "doc_id"])
    return frame.assign(rank=frame.groupby("qid").cumcount() + 1, score=0.0)


def test_lineage_of_unsplit_passages_is_the_whole_text():
    docs = pd.DataFrame({"doc_id": ["d1", "d2"], "title": ["t", "u"], "text": ["abc", "hello"]})
    lin = passage_lineage(docs).set_index("doc_id")
    assert lin.loc["d2", "document"] == "d2" and (lin.loc["d2", "char_start"], lin.loc["d2", "char_end"]) == (0, 5)


def test_span_hit_needs_the_passage_that_covers_the_span(corpus):
    lin = passage_lineage(corpus)
    start = DOC_A.index("sentence 150")  # in passage A-4000
    spans = pd.DataFrame({"qid": ["q1"], "document": ["A"], "span_start": [start], "span_end": [start + 12]})
    assert corpus.set_index("doc_id").loc["A-4000", "text"][start - 4000:][:12] == "sentence 150"
    hits = hits_of([("q1", "A-0"), ("q1", "B-0"), ("q1", "A-4000")])
    assert span_hit_at_k(hits, lin, spans, [1, 2, 3]) == {"span_hit@1": 0.0, "span_hit@2": 0.0, "span_hit@3": 100.0}
    # right document, wrong passage: a document hit, not a span hit
    gold = gold_documents(pd.DataFrame({"qid": ["q1"], "doc_id": ["A"]}), lin)
    assert document_recall(hits, lin, gold, [1], ["q1"]) == {"doc_recall@1": 100.0}


def test_a_span_across_a_passage_boundary_is_in_no_passage(corpus):
    lin = passage_lineage(corpus)
    spans = pd.DataFrame({"qid": ["q1"], "document": ["A"], "span_start": [995], "span_end": [1005]})
    hits = hits_of([("q1", "A-0"), ("q1", "A-1000")])
    assert span_hit_at_k(hits, lin, spans, [2]) == {"span_hit@2": 0.0}


def test_gold_passage_stands_for_its_document_and_counts_once(corpus):
    lin = passage_lineage(corpus)
    gold = gold_documents(pd.DataFrame({"qid": ["q1", "q1"], "doc_id": ["A-0", "B-1000"]}), lin)
    assert sorted(gold["document"]) == ["A", "B"]
    hits = hits_of([("q1", "A-2000"), ("q1", "A-3000"), ("q1", "B-0")])
    assert document_recall(hits, lin, gold, [2, 3], ["q1", "q2"]) == {"doc_recall@2": 50.0, "doc_recall@3": 100.0}


def test_span_in_context_agrees_with_answer_in_context_on_unique_answers(corpus):
    """Oracle: where every answer string occurs once in the corpus, "the span is in the packed context" and
    "the answer string is in the packed context" are the same event, budget by budget."""
    lin = passage_lineage(corpus)
    rng = np.random.default_rng(0)
    ids = corpus["doc_id"].tolist()
    rows, span_list, answers = [], [], {}
    for q in range(40):
        qid = f"q{q}"
        i = int(rng.integers(0, 200))
        answer = f"sentence {i:03d}"
        start = DOC_A.index(answer)
        span_list.append((qid, "A", start, start + len(answer)))
        answers[qid] = [answer]
        rows += [(qid, d) for d in rng.permutation(ids)[:6]]
    hits = hits_of(rows)
    spans = pd.DataFrame(span_list, columns=["qid", "document", "span_start", "span_end"])
    budgets = [100, 300, 600, 1200]
    by_span = span_in_context(hits, lin, spans, budgets)
    by_string = answer_in_context(contexts_for(hits, corpus, None, 6), answers, budgets)
    assert len({v for v in by_span.values()}) > 1  # the budgets differ, so the check is not vacuous
    for b in budgets:
        assert by_span[f"span_in_context@{b}"] == by_string[f"answer_in_context@{b}"], b


def test_the_cut_top_passage_holds_only_its_first_budget_of_characters():
    docs = pd.DataFrame([{"doc_id": "A", "title": "A", "text": DOC_A}])
    lin = passage_lineage(docs)
    hits = hits_of([("q1", "A")])
    near = pd.DataFrame({"qid": ["q1"], "document": ["A"], "span_start": [100], "span_end": [110]})
    deep = pd.DataFrame({"qid": ["q1"], "document": ["A"], "span_start": [5000], "span_end": [5010]})
    assert span_in_context(hits, lin, near, [100]) == {"span_in_context@100": 100.0}
    assert span_in_context(hits, lin, deep, [100, 2000]) == {"span_in_context@100": 0.0, "span_in_context@2000": 100.0}


def test_span_rows_only_for_questions_with_a_span():
    questions = pd.DataFrame({"qid": ["q1", "q2"], "span_start": pd.array([5, None], dtype="Int64"),
                              "span_end": pd.array([9, None], dtype="Int64")})
    gold = pd.DataFrame({"qid": ["q1", "q2"], "document": ["A", "B"]})
    assert span_rows(questions, gold, ["q1", "q2"]).values.tolist() == [["q1", "A", 5, 9]]
    assert span_rows(questions.drop(columns=["span_start", "span_end"]), gold, ["q1"]).empty


def test_result_size_is_the_mean_over_top_n_results(corpus):
    lin = passage_lineage(corpus)
    hits = hits_of([("q1", "A-0"), ("q1", "B-2000"), ("q1", "A-1000"), ("q2", "B-0")])
    b_last = len(DOC_B) - 2000
    assert result_size(hits, lin, 2, ["q1", "q2"]) == {
        "result_chars@2": round((1000 + b_last + 1000) / 3, 1),
        "result_tokens@2": round((250 + np.ceil(b_last / 4) + 250) / 3, 1)}
