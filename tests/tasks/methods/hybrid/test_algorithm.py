"""Tests for tasks/methods/hybrid/algorithm.py: RRF against a hand-computed batch and against a naive per-query
dict implementation (batched == sequential) on random lists with padding, duplicates across lists and ties."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.methods.hybrid.algorithm import reciprocal_rank_fusion


def naive_rrf(rows: list[list[int]], k: float, weights: list[float], top_k: int) -> list[tuple[int, float]]:
    """One query, the equation read literally: a dict of summed w / (k + rank), then sort."""
    score: dict[int, float] = {}
    first: dict[int, int] = {}
    for li, (row, w) in enumerate(zip(rows, weights)):
        for rank, doc in enumerate(row, start=1):
            if doc < 0:
                continue
            score[doc] = score.get(doc, 0.0) + w / (k + rank)
            if li == 0:
                first.setdefault(doc, rank)
    ranked = sorted((d for d in score if score[d] > 0), key=lambda d: (-score[d], first.get(d, math.inf), d))
    return [(d, score[d]) for d in ranked[:top_k]]


def test_hand_computed_batch():
    dense = np.array([[3, 1, 2], [0, 1, -1]])
    bm25 = np.array([[1, 4, -1], [1, 0, -1]])
    ids, scores = reciprocal_rank_fusion([dense, bm25], k=60)
    # query 0: doc 1 = 1/62 + 1/61, doc 3 = 1/61, doc 4 = 1/62, doc 2 = 1/63
    assert ids[0].tolist() == [1, 3, 4, 2, -1, -1]
    np.testing.assert_allclose(scores[0, :4], [1 / 62 + 1 / 61, 1 / 61, 1 / 62, 1 / 63])
    # query 1: docs 0 and 1 tie at 1/61 + 1/62; doc 0 is first in the first (dense) list
    assert ids[1].tolist() == [0, 1, -1, -1, -1, -1]
    assert scores[1, 0] == scores[1, 1] and scores[1, 2] == 0.0


def test_weights_top_k_and_zero_weight_lists():
    dense = np.array([[5, 6, 7]])
    bm25 = np.array([[7, 8, 9]])
    ids, scores = reciprocal_rank_fusion([dense, bm25], k=1, weights=[2.0, 1.0], top_k=2)
    # doc 7 = 2/(1+3) + 1/(1+1) = 1.0 ties doc 5 = 2/(1+1): 5 is 1st in the first list, 7 3rd → 5 first
    assert ids.tolist() == [[5, 7]] and scores.tolist() == [[1.0, 1.0]]
    ids, _ = reciprocal_rank_fusion([dense, bm25], k=60, weights=[1.0, 0.0], top_k=5)
    assert ids.tolist() == [[5, 6, 7, -1, -1]]  # weight 0: BM25's own finds are not returned
    ids, _ = reciprocal_rank_fusion([dense, bm25], k=60, weights=[0.0, 1.0], top_k=3)
    assert ids.tolist() == [[7, 8, 9]]


def test_empty_and_bad_arguments():
    ids, scores = reciprocal_rank_fusion([np.full((2, 3), -1), np.zeros((2, 0), int)], top_k=4)
    assert (ids == -1).all() and ids.shape == (2, 4) and (scores == 0).all()
    for kwargs in ({"k": 0}, {"k": -1.0}, {"k": float("nan")}, {"weights": [1.0]}, {"weights": [1.0, -1.0]}):
        with pytest.raises(ValueError):
            reciprocal_rank_fusion([np.zeros((1, 2), int), np.zeros((1, 2), int)], **kwargs)


def random_lists(rng: np.random.Generator, n_q: int, n_docs: int, depths: list[int]) -> list[np.ndarray]:
    """Per query and list, distinct docs best first; a random tail (and a few random slots) padded with -1."""
    out = []
    for depth in depths:
        rows = np.stack([rng.permutation(n_docs)[:depth] for _ in range(n_q)]).astype(np.int64)
        tail = rng.integers(0, depth + 1, size=n_q)
        rows[np.arange(depth)[None, :] >= tail[:, None]] = -1
        rows[rng.random(rows.shape) < 0.05] = -1
        out.append(rows)
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_q=st.integers(1, 12), n_docs=st.integers(1, 30),
       n_lists=st.integers(1, 3), k=st.sampled_from([0.5, 1.0, 60.0]), top_k=st.integers(1, 40),
       integer_weights=st.booleans())
def test_batched_equals_naive_per_query(seed, n_q, n_docs, n_lists, k, top_k, integer_weights):
    rng = np.random.default_rng(seed)
    depths = [int(rng.integers(0, n_docs + 1)) for _ in range(n_lists)]
    lists = random_lists(rng, n_q, n_docs, depths)
    # integer weights (0 included) give many exact ties; random ones exercise the sums
    weights = (rng.integers(0, 3, n_lists) if integer_weights else rng.random(n_lists)).astype(float).tolist()
    ids, scores = reciprocal_rank_fusion(lists, k=k, weights=weights, top_k=top_k)
    assert ids.shape == scores.shape == (n_q, top_k)
    for i in range(n_q):
        want = naive_rrf([r[i].tolist() for r in lists], k, weights, top_k)
        got = [(int(d), s) for d, s in zip(ids[i], scores[i]) if d >= 0]
        assert [d for d, _ in got] == [d for d, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-12)
        assert (ids[i, len(want):] == -1).all() and (scores[i, len(want):] == 0).all()


def test_fused_scores_are_sorted_and_order_of_queries_does_not_matter():
    rng = np.random.default_rng(0)
    lists = random_lists(rng, 20, 50, [30, 30])
    ids, scores = reciprocal_rank_fusion(lists, top_k=25)
    assert (np.diff(scores, axis=1) <= 0).all()
    perm = rng.permutation(20)
    ids_p, scores_p = reciprocal_rank_fusion([r[perm] for r in lists], top_k=25)
    np.testing.assert_array_equal(ids_p, ids[perm])
    np.testing.assert_array_equal(scores_p, scores[perm])
