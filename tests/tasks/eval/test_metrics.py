"""Tests for ``tasks.eval.metrics`` (recall@k, latency)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tasks.eval.metrics import latency_summary, names_gold_title, recall_at_k, recall_by_title_mention


def _hits(rows: list[tuple[str, int, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["qid", "rank", "doc_id"]).assign(score=0.0)


def _gold(rows: list[tuple[str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["qid", "doc_id"])


# ----------------------------------------------------------------------------- recall@k

def test_recall_partial_gold_and_question_without_hits():
    hits = _hits([("q1", 1, "d3"), ("q1", 2, "d1"), ("q1", 3, "d2"),
                  ("q3", 1, "d9"),                       # q3 has no gold: skipped
                  ("q4", 1, "d5")])                      # q4 not among the evaluated qids
    gold = _gold([("q1", "d1"), ("q1", "d2"), ("q2", "d4"), ("q4", "d5")])
    # q1: 0/2, 1/2, 2/2 at k = 1, 2, 3; q2 (no hits at all): 0
    got = recall_at_k(hits, gold, [1, 2, 3, 10], ["q1", "q2", "q3"])
    assert got == {"recall@1": 0.0, "recall@2": 25.0, "recall@3": 50.0, "recall@10": 50.0}


def test_recall_rounds_to_two_decimals():
    hits = _hits([("q", 1, "a")])
    gold = _gold([("q", "a"), ("q", "b"), ("q", "c")])
    assert recall_at_k(hits, gold, [1], ["q"]) == {"recall@1": 33.33}


def test_recall_duplicates_count_once():
    gold = _gold([("q", "a"), ("q", "b")])
    dup_hits = _hits([("q", 1, "a"), ("q", 2, "a"), ("q", 3, "b")])
    assert recall_at_k(dup_hits, gold, [1, 2, 3], ["q"]) == {"recall@1": 50.0, "recall@2": 50.0, "recall@3": 100.0}
    dup_gold = _gold([("q", "a"), ("q", "a"), ("q", "b")])
    hits = _hits([("q", 1, "a"), ("q", 2, "c")])
    assert recall_at_k(hits, dup_gold, [2], ["q"]) == {"recall@2": 50.0}


def test_recall_without_any_gold_is_nan():
    got = recall_at_k(_hits([("q", 1, "a")]), _gold([("other", "a")]), [1, 5], ["q"])
    assert set(got) == {"recall@1", "recall@5"} and all(math.isnan(v) for v in got.values())
    assert all(math.isnan(v) for v in recall_at_k(_hits([]), _gold([]), [1], []).values())


def test_recall_is_monotone_in_k_on_random_data():
    rng = np.random.default_rng(1)
    docs = [f"d{i}" for i in range(30)]
    hits, gold = [], []
    for q in range(25):
        ranked = rng.permutation(docs)[:10]
        hits += [(f"q{q}", r + 1, d) for r, d in enumerate(ranked)]
        gold += [(f"q{q}", d) for d in rng.choice(docs, size=rng.integers(1, 4), replace=False)]
    got = recall_at_k(_hits(hits), _gold(gold), [1, 3, 5, 10], [f"q{q}" for q in range(25)])
    vals = list(got.values())
    assert vals == sorted(vals) and 0 <= vals[0] and vals[-1] <= 100
    # brute force for k = 5
    g = pd.DataFrame(gold, columns=["qid", "doc_id"]).groupby("qid")["doc_id"].apply(set)
    h = pd.DataFrame(hits, columns=["qid", "rank", "doc_id"])
    top5 = h[h["rank"] <= 5].groupby("qid")["doc_id"].apply(set)
    expected = np.mean([len(g[q] & top5.get(q, set())) / len(g[q]) for q in g.index]) * 100
    assert got["recall@5"] == pytest.approx(expected, abs=0.005)


# ----------------------------------------------------------------------------- latency

def test_latency_summary():
    got = latency_summary(pd.DataFrame({"ms": np.arange(1, 101, dtype=float)}))
    assert got == pytest.approx({"mean": 50.5, "p50": 50.5, "p95": 95.05, "p99": 99.01})
    assert latency_summary(pd.DataFrame({"t": [4.0, 2.0]}), column="t", min_timings=2) == pytest.approx(
        {"mean": 3.0, "p50": 3.0, "p95": 3.9, "p99": 3.98})
    empty = latency_summary(pd.DataFrame({"ms": []}))
    assert set(empty) == {"mean", "p50", "p95", "p99"} and all(math.isnan(v) for v in empty.values())


def test_latency_percentiles_are_over_timed_batches_and_absent_for_too_few():
    """Queries timed in batches share their batch's ms per query: the percentiles are the batches', and one or
    two batches give none (they were the mean, three times over)."""
    two = pd.DataFrame({"batch": [0] * 256 + [1] * 125, "ms": [4.0] * 256 + [6.0] * 125})
    got = latency_summary(two)
    assert got["mean"] == pytest.approx((4 * 256 + 6 * 125) / 381) and got["p50"] is got["p95"] is got["p99"] is None
    batches = pd.DataFrame({"batch": np.repeat(np.arange(6), [100, 100, 100, 100, 100, 1]),
                            "ms": np.repeat([1.0, 2.0, 3.0, 4.0, 5.0, 100.0], [100, 100, 100, 100, 100, 1])})
    got = latency_summary(batches)
    assert got["p50"] == pytest.approx(3.5)  # the batches' median, not the queries' (3.0)
    assert got["p99"] == pytest.approx(np.percentile([1, 2, 3, 4, 5, 100], 99))
    assert got["mean"] == pytest.approx((100 * 15 + 100) / 501)


def test_dev_split_is_seeded_disjoint_and_sized():
    from tasks.eval.metrics import dev_split

    qids = [f"q{i}" for i in range(10)]
    dev, test = dev_split(qids, 0.3, seed=0)
    assert len(dev) == 3 and len(test) == 7 and not set(dev) & set(test) and set(dev) | set(test) == set(qids)
    assert dev_split(list(reversed(qids)), 0.3, seed=0)[0] == list(reversed(dev))  # order does not decide a side
    assert dev_split(qids, 0.3, seed=1)[0] != dev


def test_recall_by_title_mention_splits_on_gold_titles_named_whole_word():
    documents = pd.DataFrame({"doc_id": ["a", "b", "c", "d"],
                              "title": ["Peter Jones (actor)", "Rome", "Romeo", "Place"]})
    questions = pd.DataFrame({"qid": ["q1", "q2", "q3"],
                              "question": ["Where was peter jones's wife born?", "Who loved Romeo?",
                                           "Which city is older?"]})
    gold = pd.DataFrame({"qid": ["q1", "q1", "q2", "q3", "q3"], "doc_id": ["a", "b", "b", "b", "d"]})
    named = names_gold_title(questions, gold, documents)
    assert named.to_dict() == {"q1": True, "q2": False, "q3": False}  # "Rome" is not a word of "Romeo"
    hits = pd.DataFrame({"qid": ["q1", "q1", "q2", "q3"], "rank": [1, 2, 1, 1], "doc_id": ["a", "c", "b", "d"]})
    out = recall_by_title_mention(hits, gold, questions, documents, [1, 2], ["q1", "q2", "q3"])
    assert out["names_gold_title"] == {"n": 1, "recall@1": 50.0, "recall@2": 50.0}
    assert out["names_no_gold_title"] == {"n": 2, "recall@1": 75.0, "recall@2": 75.0}
