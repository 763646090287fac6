"""Evidence and context recall: the matching rule, the passage rule, the reader's budget."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tasks.data.ingest import supporting_sentences
from tasks.eval.evidence import (
    context_recall,
    evidence_recall,
    passage_sentences,
    rank_sentences,
    reader_context_docs,
    score_evidence,
    sentence_found,
    with_source_documents,
)


def test_supporting_sentences_keeps_indexed_facts_only():
    records = [
        {"_id": "h1", "supporting_facts": [["A", 1], ["B", 0], ["B", 7]],
         "context": [["A", ["A one.", " A two."]], ["B", ["B one."]]]},
        {"_id": "w1", "supporting_facts": [["A", None]], "context": [["A", ["whole passage"]]]},  # 2wiki-dev
        {"id": "m1", "paragraphs": [{"title": "A", "paragraph_text": "x", "is_supporting": True}]},  # MuSiQue
    ]
    got = supporting_sentences(records)
    assert got[["qid", "title", "sent_idx", "sentence"]].values.tolist() == [["h1", "A", 1, "A two."],
                                                                             ["h1", "B", 0, "B one."]]


def test_sentence_found_rule():
    assert sentence_found("Paris is big.", ["In fact  PARIS is big. It is."])  # contained, normalised
    assert sentence_found("Paris is big, and old.", ["paris is big,"])  # a half-length piece of it
    assert not sentence_found("Paris is big, and very very old.", ["paris"])  # too short a piece
    assert not sentence_found("Paris is big.", [])


def test_evidence_recall_means_over_questions_with_sentences():
    gold = pd.DataFrame({"qid": ["a", "a", "b"], "sentence": ["s one.", "s two.", "t one."]})
    units = {"a": ["s one."], "b": ["t one.", "x"]}
    assert evidence_recall(units, gold, ["a", "b", "c"]) == 75.0  # (1/2 + 1) / 2; c has no sentences
    assert np.isnan(evidence_recall(units, gold, ["c"]))


def test_passage_rule_ranks_sentences_of_top_k_passages_by_cosine():
    docs = pd.DataFrame({"doc_id": ["d1", "d2", "d3"], "title": ["", "", ""],
                         "text": ["First one. Second one.", "Third one.", "Deep one."]})
    hits = pd.DataFrame({"qid": ["q"] * 3, "rank": [1, 2, 3], "doc_id": ["d1", "d2", "d3"]})
    sents = passage_sentences(hits, docs, 2)
    assert sents["sentence"].tolist() == ["First one.", "Second one.", "Third one."]  # d3 is below depth 2
    cos = np.array([0.1, 0.9, 0.5])
    assert rank_sentences(sents, cos, 1) == {"q": ["Second one."]}  # d1's sentences only, capped at 1
    assert rank_sentences(sents, cos, 2) == {"q": ["Second one.", "Third one."]}  # d1 and d2's, capped at 2


def test_context_recall_counts_what_fits_the_budget_and_summary_nodes():
    docs = pd.DataFrame({"doc_id": ["d1", "d2"], "title": ["A", "B"], "text": ["x" * 40, "y" * 40]})
    hits = pd.DataFrame({"qid": ["q", "q"], "rank": [1, 2], "doc_id": ["d1", "d2"]})
    gold = pd.DataFrame({"qid": ["q", "q"], "doc_id": ["d1", "d2"]})
    assert context_recall(reader_context_docs(hits, docs, None, 5, 2000), gold, ["q"]) == 100.0
    assert context_recall(reader_context_docs(hits, docs, None, 1, 2000), gold, ["q"]) == 50.0
    assert context_recall(reader_context_docs(hits, docs, None, 5, 12), gold, ["q"]) == 50.0  # d2 does not fit
    # a method's own context: a summary node standing for d1 and d2 reaches both
    traces = pd.DataFrame({"qid": ["q"], "kept_chunks": ['["a summary"]'], "context_docs": ['[["d1", "d2"]]']})
    assert context_recall(reader_context_docs(hits, docs, traces, 1, 2000), gold, ["q"]) == 100.0


def test_context_recall_counts_a_passage_for_its_document():
    """Split documents with gold per document (``dataset=jsonl``/``folder``): a passage of the gold document in
    the reader's context counts for it (it read 0.0 when the context held passage ids and gold document ids);
    unsplit passages (the benchmarks) keep their own ids."""
    docs = pd.DataFrame({"doc_id": ["D-1", "D-2", "E-1"], "title": ["D", "D", "E"], "text": ["d one", "d two", "e"],
                         "document": ["D", "D", "E"]})
    hits = pd.DataFrame({"qid": ["q", "q", "r"], "rank": [1, 2, 1], "doc_id": ["D-2", "E-1", "E-1"]})
    gold = pd.DataFrame({"qid": ["q", "r"], "doc_id": ["D", "D"]})
    no_sentences = pd.DataFrame(columns=["qid", "sentence"])

    def score(documents: pd.DataFrame, passages: int) -> float:
        return score_evidence(hits, documents, gold, no_sentences, pd.DataFrame(columns=["qid", "question"]), None,
                              [5], False, True, passages, 2000, None, None)["context_recall"]

    assert score(docs, 5) == 50.0  # q's context holds a passage of D, r's only E's
    assert score(docs.drop(columns="document"), 5) == 0.0  # passage ids alone never meet document gold
    assert with_source_documents({"q": {"D-2"}}, docs) == {"q": {"D-2", "D"}}
    unsplit = docs.assign(document=docs["doc_id"])
    assert with_source_documents({"q": {"D-2"}}, unsplit) == {"q": {"D-2"}}
