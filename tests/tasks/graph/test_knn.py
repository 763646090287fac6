"""Tests for tasks/graph/knn.py: a row-by-row brute-force oracle for every option and their combinations,
blocked == unblocked, symmetrisation properties and the zeroed diagonal."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.graph.knn import knn_graph, mean_std_mask, sparsify, symmetrised, top_k_mask


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(emb: np.ndarray, k=None, min_similarity=None, k_std=None, transform=None, symmetrise="none",
                zero_diagonal=True) -> tuple[np.ndarray, np.ndarray]:
    """(kept mask, weights) of the graph, row by row in float64 with plain sorting."""
    cos = emb.astype(np.float64) @ emb.T.astype(np.float64)
    n = len(emb)
    keep, weight = np.zeros((n, n), dtype=bool), np.zeros((n, n))
    for i in range(n):
        cand = np.array([j for j in range(n) if not (zero_diagonal and j == i)], dtype=np.int64)
        sims = cos[i, cand]
        w = sims if transform is None else transform(sims)
        ok = np.ones(len(cand), dtype=bool)
        if min_similarity is not None:
            ok &= sims >= min_similarity
        if k_std is not None:
            ok &= w > w.mean() + k_std * w.std()
        if k is not None:
            ok &= np.isin(np.arange(len(cand)), np.argsort(-w, kind="stable")[:k])
        keep[i, cand[ok]] = True
        weight[i, cand] = w
    if symmetrise == "union":
        keep = keep | keep.T
    elif symmetrise == "mutual":
        keep = keep & keep.T
    if symmetrise != "none":
        weight = np.maximum(np.where(keep, weight, -np.inf), np.where(keep, weight.T, -np.inf))
    return keep, np.where(keep, weight, 0.0)


def assert_graph(got: sp.csr_array, want: tuple[np.ndarray, np.ndarray], atol: float = 1e-6) -> None:
    keep, weight = want
    assert isinstance(got, sp.csr_array) and got.dtype == np.float64
    dense = np.zeros(keep.shape, dtype=bool)
    c = got.tocoo()
    dense[c.row, c.col] = True
    assert np.array_equal(dense, keep)
    assert np.abs(got.toarray() - weight).max(initial=0.0) < atol


# ---------------------------------------------------------------- each option vs brute force


@pytest.mark.parametrize("k", [1, 5, 39, 60])
@pytest.mark.parametrize("zero_diagonal", [True, False])
def test_top_k_matches_brute_force(k, zero_diagonal):
    emb = unit_rows(np.random.default_rng(k), 40, 8)
    got = knn_graph(emb, k=k, zero_diagonal=zero_diagonal, block_rows=16)
    assert_graph(got, brute_force(emb, k=k, zero_diagonal=zero_diagonal))
    per_row = np.diff(got.indptr)
    assert np.all(per_row == min(k, 40 - zero_diagonal))


@pytest.mark.parametrize("min_similarity", [-0.2, 0.0, 0.3])
def test_min_similarity_matches_brute_force(min_similarity):
    emb = unit_rows(np.random.default_rng(1), 50, 6)
    got = knn_graph(emb, min_similarity=min_similarity, block_rows=7)
    assert_graph(got, brute_force(emb, min_similarity=min_similarity))
    assert got.data.min() >= min_similarity


@pytest.mark.parametrize("transform", [None, np.exp])
@pytest.mark.parametrize("k_std", [0.0, 1.0, 3.0])
def test_k_std_matches_brute_force(transform, k_std):
    emb = unit_rows(np.random.default_rng(2), 80, 8)
    got = knn_graph(emb, k_std=k_std, transform=transform, block_rows=32)
    assert_graph(got, brute_force(emb, k_std=k_std, transform=transform))


@pytest.mark.parametrize(
    "options",
    [
        dict(k=3, k_std=1.0, transform=np.exp),  # a top-k cap on ZoomRAG's mean + k*std
        dict(k=4, min_similarity=0.1),  # faiss path with a floor
        dict(k=6, min_similarity=0.0, k_std=0.5),
        dict(min_similarity=0.2, k_std=1.0, transform=lambda c: (1.0 + c) / 2.0),  # a non-ufunc transform
        dict(k=5, transform=np.exp, symmetrise="union"),
        dict(k=5, symmetrise="mutual", zero_diagonal=False),
        dict(k_std=1.0, transform=np.exp, symmetrise="union"),
        dict(k=8, k_std=0.5, symmetrise="mutual"),
    ],
)
def test_combined_options_match_brute_force(options):
    emb = unit_rows(np.random.default_rng(3), 45, 6)
    assert_graph(knn_graph(emb, block_rows=10, **options), brute_force(emb, **options))


def test_sparsify_block_matches_brute_force_and_leaves_input():
    rng = np.random.default_rng(4)
    docs, queries = unit_rows(rng, 200, 12), unit_rows(rng, 9, 12)
    cos = queries @ docs.T
    before = cos.copy()
    got = sparsify(cos, k=10, k_std=1.0, min_similarity=0.05, transform=np.exp)
    assert np.array_equal(cos, before)
    want = np.zeros(cos.shape)
    for i, row in enumerate(cos.astype(np.float64)):
        w = np.exp(row)
        ok = (row >= 0.05) & (w > w.mean() + w.std()) & np.isin(np.arange(200), np.argsort(-w)[:10])
        want[i, ok] = w[ok]
    assert np.array_equal(got.toarray() != 0, want != 0)
    assert np.abs(got.toarray() - want).max() < 1e-6


def test_mean_std_mask_keeps_exactly_entries_above_threshold():
    rng = np.random.default_rng(0)
    S = rng.normal(size=(40, 200))
    S[np.arange(40), rng.integers(0, 200, 40)] += 10.0  # one clear outlier per row
    mask = mean_std_mask(S, 3.0)
    thr = S.mean(axis=1, keepdims=True) + 3.0 * S.std(axis=1, keepdims=True)
    assert np.array_equal(mask, S > thr)
    assert mask.sum(axis=1).min() >= 1
    kept = sparsify(S, k_std=3.0)
    assert np.array_equal(kept.toarray() != 0, S > thr)
    assert np.array_equal(kept.toarray()[mask], S[mask])


def test_masks_on_hand_rows():
    S = np.array([[1.0, 1.0, 1.0, 1.0], [np.nan, 0.0, 0.0, 100.0], [3.0, 1.0, 2.0, np.nan]])
    assert mean_std_mask(S, 1.0).tolist() == [[False] * 4, [False, False, False, True], [True, False, False, False]]
    assert top_k_mask(S, 2)[1:].tolist() == [[False, True, False, True], [True, False, True, False]]
    assert top_k_mask(S, 9)[2].tolist() == [True, True, True, False]  # k beyond the row: every non-NaN cell
    assert not top_k_mask(S, 0).any()


def test_a_test_is_required():
    with pytest.raises(ValueError):
        knn_graph(np.eye(3, dtype=np.float32))
    with pytest.raises(ValueError):
        symmetrised(sp.csr_array(np.eye(3)), "both")


# ---------------------------------------------------------------- blocking, symmetry, diagonal


@pytest.mark.parametrize("options", [dict(k=4), dict(k_std=1.0, transform=np.exp), dict(min_similarity=0.1),
                                     dict(k=3, k_std=0.5, symmetrise="union")])
def test_blocked_equals_unblocked(options):
    emb = unit_rows(np.random.default_rng(5), 70, 8)
    whole = knn_graph(emb, block_rows=70, **options)
    for block_rows in (1, 9, 64):
        part = knn_graph(emb, block_rows=block_rows, **options)
        assert np.array_equal(part.indptr, whole.indptr) and np.array_equal(part.indices, whole.indices)
        assert np.abs(part.data - whole.data).max(initial=0.0) < 1e-6


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12), use_std=st.booleans())
def test_union_and_mutual_are_symmetric_and_nest(seed, k, use_std):
    emb = unit_rows(np.random.default_rng(seed), 30, 5)
    options = dict(k=k, k_std=0.5 if use_std else None)
    directed = knn_graph(emb, **options).toarray() != 0
    union = knn_graph(emb, symmetrise="union", **options)
    mutual = knn_graph(emb, symmetrise="mutual", **options)
    for g in (union, mutual):
        assert abs(g - g.T).max() == 0  # symmetric, weights included
        assert np.all(g.diagonal() == 0)
    u, m = union.toarray() != 0, mutual.toarray() != 0
    assert np.array_equal(u, directed | directed.T)
    assert np.array_equal(m, directed & directed.T)


def test_zeroed_diagonal_survives_duplicate_rows():
    """Tied duplicates may push a row's own index out of faiss's k+1 hits; it still gets k others."""
    base = unit_rows(np.random.default_rng(6), 5, 4)
    emb = np.repeat(base, 6, axis=0)  # 6 identical copies of each row
    for k in (2, 5, 7):
        g = knn_graph(emb, k=k)
        assert np.all(g.diagonal() == 0) and np.all(np.diff(g.indptr) == k)
        c = g.tocoo()
        assert np.all(c.row != c.col)
    kept = knn_graph(emb, k=3, zero_diagonal=False)
    assert np.all(np.diff(kept.indptr) == 3)


def test_symmetrised_takes_the_larger_weight_of_a_pair():
    g = sp.csr_array(np.array([[0.0, 2.0, -1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]]))
    assert symmetrised(g, "union").toarray().tolist() == [[0, 3, -1], [3, 0, 0], [-1, 0, 5]]
    assert symmetrised(g, "mutual").toarray().tolist() == [[0, 3, 0], [3, 0, 0], [0, 0, 5]]


# ---------------------------------------------------------------- the old ZoomRAG sparsification, bit for bit


# ---------------------------------------------------------------- capped mean + k*std at scale (100,000 passages)


@pytest.mark.parametrize("k,k_std,zero_diagonal", [(3, 1.0, True), (10, 0.0, True), (7, 0.5, False)])
def test_faiss_top_k_with_full_sample_statistics_is_the_exact_rule(k, k_std, zero_diagonal):
    emb = unit_rows(np.random.default_rng(11), 60, 6)
    got = knn_graph(emb, k=k, k_std=k_std, transform=np.exp, zero_diagonal=zero_diagonal, block_rows=16,
                    stats_sample=60)
    assert_graph(got, brute_force(emb, k=k, k_std=k_std, transform=np.exp, zero_diagonal=zero_diagonal))


def test_sampled_row_statistics_are_exact_with_every_column_and_close_with_a_sample():
    from tasks.graph.knn import sampled_row_stats

    emb = unit_rows(np.random.default_rng(12), 400, 8)
    w = np.exp(emb.astype(np.float64) @ emb.T.astype(np.float64))
    np.fill_diagonal(w, np.nan)
    mean, std = sampled_row_stats(emb, 400, np.exp, block_rows=64)
    assert np.allclose(mean, np.nanmean(w, axis=1), atol=1e-5) and np.allclose(std, np.nanstd(w, axis=1), atol=1e-5)
    m_s, s_s = sampled_row_stats(emb, 200, np.exp, block_rows=64, seed=3)
    assert not np.allclose(m_s, mean, atol=1e-7)  # a real sample, not every column
    assert np.abs(m_s - mean).max() < 0.05 * mean.std() + 3 * std.max() / np.sqrt(200)


def test_ivf_search_with_every_cell_probed_is_exact_and_with_few_cells_misses_some():
    emb = unit_rows(np.random.default_rng(13), 2000, 16)
    exact = knn_graph(emb, k=10)
    full = knn_graph(emb, k=10, search="ivf", ivf_nlist=20, ivf_nprobe=20)
    assert np.array_equal(exact.toarray() != 0, full.toarray() != 0)
    assert np.abs(exact.toarray() - full.toarray()).max() < 1e-5
    few = knn_graph(emb, k=10, search="ivf", ivf_nlist=20, ivf_nprobe=1)
    assert np.all(np.diff(few.indptr) <= 10)
    overlap = (exact.multiply(few) != 0).sum() / exact.nnz
    assert 0.1 < overlap < 1.0  # approximate: fewer cells searched, some true neighbours missed
    again = knn_graph(emb, k=10, search="ivf", ivf_nlist=20, ivf_nprobe=1)
    assert (few != again).nnz == 0  # seeded k-means: the same lists every time


def test_search_auto_is_exact_up_to_the_limit_and_ivf_above():
    from tasks.graph.knn import search_for

    assert search_for(50_000, "auto", 50_000) == "exact"
    assert search_for(50_001, "auto", 50_000) == "ivf"
    assert search_for(10, "ivf", 50_000) == "ivf" and search_for(10**6, "exact") == "exact"
    with pytest.raises(ValueError, match="kNN search"):
        search_for(10, "hnsw")
    emb = unit_rows(np.random.default_rng(16), 300, 8)
    with pytest.raises(ValueError, match="kNN search"):  # no silent exact search for a misspelt name
        knn_graph(emb, k=5, search="hnsw")
    assert (knn_graph(emb, k=5, search="auto", exact_max=300) != knn_graph(emb, k=5)).nnz == 0
    few = knn_graph(emb, k=5, search="ivf", ivf_nlist=7, ivf_nprobe=1)
    assert (few != knn_graph(emb, k=5)).nnz > 0  # one cell of seven searched: not the exact graph
    assert (knn_graph(emb, k=5, search="auto", exact_max=299, ivf_nlist=7, ivf_nprobe=1) != few).nnz == 0


def test_ivf_cells_default_to_the_square_root_of_the_rows():
    from tasks.graph.knn import ivf_index

    assert ivf_index(unit_rows(np.random.default_rng(15), 3000, 8)).nlist == 54  # int(sqrt(3000))
    assert ivf_index(unit_rows(np.random.default_rng(15), 400, 8)).nlist == 10  # capped at 39 points a cell


def test_ivf_search_needs_a_neighbour_list():
    emb = unit_rows(np.random.default_rng(14), 50, 4)
    with pytest.raises(ValueError, match="needs k"):
        knn_graph(emb, k_std=1.0, search="ivf")
