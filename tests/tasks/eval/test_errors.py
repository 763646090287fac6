"""tasks/eval/errors.py: each miss reason on a hand-made case."""
from __future__ import annotations

import pandas as pd

from tasks.eval.errors import losses_against, miss_reasons, missed_gold

DOCS = pd.DataFrame({
    "doc_id": ["a", "b", "c", "d", "e", "f", "g"],
    "title": ["Kingdom (film)", "Ann Lee", "Paris", "Paris (band)", "Hidden Place", "Tom", "Jo"],
    "text": ["Kingdom is a film directed by Ann Lee.", "Ann Lee was born in Oslo.", "Paris is a city.",
             "Paris are a band.", "A quiet village.", "Tom was born in 1950.", "Jo was born in 1960."],
})
QUESTIONS = pd.DataFrame({
    "qid": ["q1", "q2", "q3", "q4"],
    "question": ["Where was the director of Kingdom born?", "What is Paris?", "Which village is quiet?",
                 "Who is older, Tom or Jo?"],
    "qtype": ["compositional", "bridge", "bridge", "comparison"],
})
GOLD = pd.DataFrame({"qid": ["q1", "q1", "q2", "q3", "q4", "q4"], "doc_id": ["a", "b", "c", "e", "f", "g"]})


def test_each_reason():
    hits = pd.DataFrame({"qid": ["q1", "q2", "q3", "q4"], "rank": [1, 1, 1, 1], "doc_id": ["a", "d", "c", "f"]})
    missed = missed_gold(hits, GOLD, 1, ["q1", "q2", "q3", "q4"])
    assert sorted(map(tuple, missed.to_numpy())) == [("q1", "b"), ("q2", "c"), ("q3", "e"), ("q4", "g")]
    reasons = miss_reasons(missed, hits, GOLD, QUESTIONS, DOCS, 1).set_index("qid")["reason"].to_dict()
    assert reasons == {"q1": "bridge, wrong hop", "q2": "ambiguous title", "q3": "no title link",
                       "q4": "comparison, one side missing"}
    # Kingdom named, its passage not retrieved, nothing else to blame
    low = pd.DataFrame({"qid": ["q1"], "rank": [1], "doc_id": ["c"]})
    out = miss_reasons(missed_gold(low, GOLD, 1, ["q1"]), low, GOLD, QUESTIONS, DOCS, 1)
    assert out.set_index("doc_id").at["a", "reason"] == "named, ranked low"


def test_losses_count_only_questions_the_other_retriever_does_better_on():
    method = pd.DataFrame({"qid": ["q1", "q3"], "rank": [1, 1], "doc_id": ["a", "c"]})
    other = pd.DataFrame({"qid": ["q1", "q3"], "rank": [1, 1], "doc_id": ["c", "e"]})
    out = losses_against(method, other, GOLD, QUESTIONS, DOCS, 1, ["q1", "q3"])
    assert out["qid"].tolist() == ["q3"] and out["reason"].tolist() == ["no title link"]
