"""Tests for tasks/graph/topk.py: the row-wise top-k against a full lexsort."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.graph.topk import top_k_rows


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 7, 60, 1009])
def test_top_k_rows_equals_a_full_lexsort(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    q = 6
    scores = np.where(rng.random((q, n)) < 0.3, rng.integers(0, 4, (q, n)) / 4, 0.0)  # many ties
    scores[1] = rng.random(n)  # no ties
    scores[2] = 0.5  # all tied
    scores[3] = np.sort(rng.random(n))  # the best in the last block
    scores[4] = -np.inf  # nothing scored
    tie = np.round(rng.random((q, n)), 1)  # ties in the tie-break too
    for k in [1, 5, 10, n, n + 3]:
        want = np.lexsort((-tie, -scores), axis=1)[:, :k]
        got = top_k_rows(scores, k, tie)
        assert got.dtype == np.int64 and got.shape == (q, min(k, n))
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(top_k_rows(scores, k), np.lexsort((-scores,), axis=1)[:, :k])


def test_top_k_rows_of_nothing() -> None:
    assert top_k_rows(np.zeros((3, 5)), 0).shape == (3, 0)
    assert top_k_rows(np.zeros((0, 5)), 2).shape == (0, 2)
