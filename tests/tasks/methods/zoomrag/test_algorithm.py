"""Tests for tasks/methods/zoomrag/algorithm.py: oracles (explicit per-query graphs, dense references, many
iterations) and properties (mass, non-negativity, relabelling) of ZoomRAG's two walks."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.methods.zoomrag.algorithm import (
    ZoomParams,
    chunk_chunk_block,
    chunk_zoom,
    chunk_zoom_batch,
    coupled_walk,
    decoupled_walk,
    doc_doc_block,
    doc_zoom,
    gather_chunks,
    global_block,
    keep_top_chunks,
    query_doc_block,
    query_links,
    top_docs,
    walk_graph,
)

# ---------------------------------------------------------------- fixtures / references


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def random_problem(seed: int, n: int = 30, m: int = 20, q: int = 7, connected: bool = False):
    """Random shared M and query rows H; `connected` gives every node of every A_i an edge."""
    rng = np.random.default_rng(seed)
    dd = sp.random_array((n, n), density=0.15, rng=rng, format="csr") * 3
    dd.setdiag(0)
    de = (sp.random_array((n, m), density=0.12, rng=rng, format="csr") != 0).astype(float)
    if connected:
        de = de.tolil()
        de[np.arange(n), rng.integers(0, m, n)] = 1.0  # every doc has an entity
        de[rng.integers(0, n, m), np.arange(m)] = 1.0  # every entity is in a doc
    qd = sp.random_array((q, n), density=0.2, rng=rng, format="csr") * 2
    qe = (sp.random_array((q, m), density=0.15, rng=rng, format="csr") != 0).astype(float)
    if connected:
        qd = qd.tolil()
        qd[np.arange(q), rng.integers(0, n, q)] = 1.5  # every query has a doc
    return sp.csr_array(dd), sp.csr_array(de), sp.csr_array(qd), sp.csr_array(qe)


def explicit_walk(M: np.ndarray, h: np.ndarray, alpha: float, steps: int) -> np.ndarray:
    """One query's (N+1)-node graph A_i of eq. (6), column-normalised, iterated by eq. (3)."""
    N = M.shape[0]
    A = np.zeros((N + 1, N + 1))
    A[0, 1:], A[1:, 0], A[1:, 1:] = h, h, M
    s = A.sum(axis=0)
    P = np.divide(A, s, out=np.zeros_like(A), where=s > 0)
    r0 = np.zeros(N + 1)
    r0[0] = 1.0
    r = r0.copy()
    for _ in range(steps):
        r = (1 - alpha) * P @ r + alpha * r0
    return r


def dense_reference_sparsify(S: np.ndarray, k_std: float, skip_diagonal: bool) -> np.ndarray:
    """Row by row: keep entries strictly above mean + k*std of the row's (off-diagonal) entries."""
    out = np.zeros_like(S, dtype=np.float64)
    for i, row in enumerate(S):
        cols = [j for j in range(len(row)) if not (skip_diagonal and j == i)]
        vals = row[cols].astype(np.float64)
        thr = vals.mean() + k_std * vals.std()
        for j in cols:
            if row[j] > thr:
                out[i, j] = row[j]
    return out


# ---------------------------------------------------------------- sparsification / blocks


@pytest.mark.parametrize("block_rows", [1, 7, 50, 64])
def test_doc_doc_block_blocked_equals_dense(block_rows):
    emb = unit_rows(np.random.default_rng(1), 50, 8)
    ref = dense_reference_sparsify(np.exp(emb @ emb.T), 3.0, skip_diagonal=True)
    got = doc_doc_block(emb, k_std=3.0, block_rows=block_rows)
    assert got.shape == (50, 50)
    assert np.array_equal(got.toarray() != 0, ref != 0)
    assert np.abs(got.toarray() - ref).max() < 1e-6
    assert np.all(got.diagonal() == 0)


@pytest.mark.parametrize("cap", [1, 3, 10])
def test_capped_doc_doc_block_keeps_the_papers_cells_that_are_among_each_rows_best(cap):
    """Beyond the paper, for 100,000 passages: the cap only removes cells, each row keeps its ``cap`` largest of the paper's."""
    emb = unit_rows(np.random.default_rng(4), 300, 4)  # low dimension: several cells per row pass mean + 1σ
    paper = doc_doc_block(emb, k_std=1.0).toarray()
    got = doc_doc_block(emb, k_std=1.0, max_neighbors=cap).toarray()
    want = np.zeros_like(paper)
    for i, row in enumerate(paper):
        best = np.argsort(-row, kind="stable")[:cap]
        want[i, best[row[best] > 0]] = row[best[row[best] > 0]]
    assert np.array_equal(got != 0, want != 0)
    assert np.abs(got - want).max() < 1e-6
    assert (paper != 0).sum(axis=1).max() > cap  # the cap binds somewhere
    assert np.array_equal(doc_doc_block(emb, k_std=1.0, max_neighbors=0).toarray(), paper)


def test_query_doc_block_equals_dense():
    """A_doc->qry: exp(cos) above each query's mean + k*std over all documents (no diagonal rule)."""
    rng = np.random.default_rng(2)
    docs, queries = unit_rows(rng, 300, 16), unit_rows(rng, 9, 16)
    ref = dense_reference_sparsify(np.exp(queries @ docs.T), 3.0, skip_diagonal=False)
    got = query_doc_block(queries @ docs.T, 3.0, best_when_none=False)  # eq. 2 alone
    assert np.array_equal(got.toarray() != 0, ref != 0)
    assert np.abs(got.toarray() - ref).max() < 1e-6


@pytest.mark.parametrize("rescale", ["nonzero_mean", "all_mean"])
def test_global_block_rescales_each_block_to_average_one(rescale):
    dd, de, _, _ = random_problem(3)
    n, m = de.shape
    M, factors = global_block(dd, de, rescale=rescale)
    M = M.toarray()
    blocks = {"doc_doc": M[:n, :n], "doc_entity": M[:n, n:]}
    for name, block in blocks.items():
        avg = block[block != 0].mean() if rescale == "nonzero_mean" else block.mean()
        assert avg == pytest.approx(1.0), name
        assert factors[name] > 0
    assert np.array_equal(M[n:, :n], M[:n, n:].T)
    assert not M[n:, n:].any()


def test_global_block_switches_zero_their_blocks():
    dd, de, _, _ = random_problem(4)
    n = dd.shape[0]
    M = global_block(dd, de, use_doc_doc=False)[0].toarray()
    assert not M[:n, :n].any() and M[:n, n:].any()
    M = global_block(dd, de, use_entities=False)[0].toarray()
    assert M[:n, :n].any() and not M[:n, n:].any() and not M[n:, :n].any()


@pytest.mark.parametrize("rescale", ["nonzero_mean", "all_mean"])
def test_query_links_rescale_each_query_block(rescale):
    _, _, qd, qe = random_problem(5)
    n = qd.shape[1]
    H = query_links(qd, qe, rescale=rescale)[0].toarray()
    for row in H:
        for block in (row[:n], row[n:]):
            if block.any():
                avg = block[block != 0].mean() if rescale == "nonzero_mean" else block.mean()
                assert avg == pytest.approx(1.0)
    assert not query_links(qd, qe, use_query_entity=False)[0].toarray()[:, n:].any()


# ---------------------------------------------------------------- DocZoom


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("steps", [1, 5, 12])
def test_decoupled_batched_walk_equals_independent_explicit_walks(seed, steps):
    dd, de, qd, qe = random_problem(seed, q=9)
    qd = qd.tolil()
    qd[0, :] = 0  # a query linked to entities only
    params = ZoomParams(steps=steps, alpha=0.8, batch_size=4)
    M, _ = global_block(dd, de)
    H, _ = query_links(qd, qe)
    got = doc_zoom(M, sp.csr_array(qd), qe, params)
    Md = M.toarray()
    ref = np.stack([explicit_walk(Md, h, params.alpha, steps) for h in H.toarray()])
    assert got.shape == (9, 1 + M.shape[0])
    assert np.abs(got - ref).max() < 1e-6


def plain_decoupled_iteration(M: sp.sparray, H: sp.sparray, alpha: float, steps: int, dtype) -> np.ndarray:
    """Eq. (7) iterated from r(0) with no shortcut: every step sweeps M with the dense state (the oracle for the
    closed-form first step and the sparse second step of decoupled_walk)."""
    M = sp.csr_array(M, dtype=dtype)
    H = sp.csr_array(H, dtype=np.float64)
    H.sum_duplicates()
    H.eliminate_zeros()
    q, N = H.shape
    col_sum = np.asarray(M.sum(axis=0), dtype=np.float64).ravel()
    inv_col = np.divide(1.0, col_sum, out=np.zeros(N), where=col_sum > 0).astype(dtype)
    hc = H.tocoo()
    qi, jj, hv = hc.row, hc.col, hc.data
    inv_patch = (1.0 / (col_sum[jj] + hv)).astype(dtype)
    h_tilde = (hv / np.asarray(H.sum(axis=1)).ravel()[qi]).astype(dtype)
    hv = hv.astype(dtype)
    r_q, X = np.ones(q, dtype), np.zeros((N, q), dtype)
    for _ in range(steps):
        Z = X * inv_col[:, None]
        Z[jj, qi] = X[jj, qi] * inv_patch
        to_query = np.bincount(qi, weights=hv * Z[jj, qi], minlength=q)
        X = M @ Z
        X[jj, qi] += h_tilde * r_q[qi]
        r_q = ((1.0 - alpha) * to_query + alpha).astype(dtype)
        X *= np.dtype(dtype).type(1.0 - alpha)
    return np.hstack([r_q[:, None], X.T])


@pytest.mark.parametrize("sparse_max", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 5])
def test_decoupled_walk_shortcuts_equal_the_plain_iteration_bit_for_bit(dtype, steps, sparse_max):
    """The closed-form first step and the sparse steps (none, while the state is sparse, all) add the same
    products in the same order as sweeping M (sorted, as walk_graph leaves it) with the dense state."""
    dd, de, qd, qe = random_problem(7, q=9)
    qd = qd.tolil()
    qd[0, :] = 0  # a query linked to entities only
    M = walk_graph(global_block(dd, de)[0], "stored", dtype).matrix
    H, _ = query_links(sp.csr_array(qd), qe)
    got = decoupled_walk(M, H, 0.8, steps, dtype, sparse_max=sparse_max)
    assert got.dtype == dtype and np.array_equal(got, plain_decoupled_iteration(M, H, 0.8, steps, dtype))


@pytest.mark.parametrize("coupled", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_renumbered_walk_graph_gives_the_stored_numberings_scores(coupled, dtype):
    """M renumbered for locality: the same scores, in the stored numbering, up to the rounding of reordered sums."""
    dd, de, qd, qe = random_problem(8, q=9)
    M, _ = global_block(dd, de)
    params = ZoomParams(batch_size=4, walk_dtype=dtype, coupled=coupled)
    graph = walk_graph(M, "locality", dtype)
    assert graph.order is not None and np.array_equal(np.sort(graph.order), np.arange(M.shape[0]))
    assert not np.array_equal(graph.order, np.arange(M.shape[0]))  # this graph is renumbered
    stored = doc_zoom(walk_graph(M, "stored", dtype), qd, qe, params)
    moved = doc_zoom(graph, qd, qe, params)
    assert np.allclose(moved, stored, rtol=0, atol=1e-6 if dtype == "float32" else 1e-13)
    assert np.array_equal(doc_zoom(M, qd, qe, params), moved)  # a bare M is prepared by walk_node_order
    with pytest.raises(ValueError, match="node_order"):
        walk_graph(M, "random")
    with pytest.raises(ValueError, match="walk graph holds"):  # built for one state dtype, walked in another
        doc_zoom(walk_graph(M, "stored", "float64" if dtype == "float32" else "float32"), qd, qe, params)


@pytest.mark.parametrize("batch_size", [1, 4, 64])
def test_float32_walk_matches_float64_at_any_walk_batch(batch_size):
    dd, de, qd, qe = random_problem(3, q=9)
    M, _ = global_block(dd, de)
    ref = doc_zoom(M, qd, qe, ZoomParams(batch_size=100))
    got = doc_zoom(M, qd, qe, ZoomParams(batch_size=batch_size, walk_dtype="float32"))
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-6)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-5)  # the walk keeps its unit mass


@pytest.mark.parametrize("threads,batch_size", [(2, 1), (2, 4), (3, 2), (4, 64)])
def test_threaded_walk_batches_equal_the_sequential_ones(threads, batch_size):
    """Batches walked on threads write their own rows: the same numbers, bit for bit, as one after another."""
    dd, de, qd, qe = random_problem(4, q=9)
    M, _ = global_block(dd, de)
    one = doc_zoom(M, qd, qe, ZoomParams(batch_size=batch_size))
    many = doc_zoom(M, qd, qe, ZoomParams(batch_size=batch_size, walk_threads=threads))
    assert np.array_equal(one, many)


def test_coupled_walk_differs_from_decoupled():
    dd, de, qd, qe = random_problem(6, q=8)
    M, _ = global_block(dd, de)
    H, _ = query_links(qd, qe)
    dec = decoupled_walk(M, H, 0.8, 5)
    cou = coupled_walk(M, H, 0.8, 5)
    assert cou.shape == dec.shape
    assert np.abs(cou - dec).max() > 1e-3
    # a single query alone in the joint graph has nobody to interfere with
    assert np.allclose(coupled_walk(M, H[:1], 0.8, 5), dec[:1], atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    alpha=st.floats(0.05, 0.95),
    steps=st.integers(0, 8),
    rescale=st.sampled_from(["nonzero_mean", "all_mean"]),
)
def test_doc_zoom_scores_nonnegative_and_sum_to_one(seed, alpha, steps, rescale):
    dd, de, qd, qe = random_problem(seed, connected=True)
    M, _ = global_block(dd, de, rescale=rescale)
    exact = ZoomParams(alpha=alpha, steps=steps, rescale=rescale, walk_dtype="float64")
    scores = doc_zoom(M, qd, qe, exact)
    assert scores.min() >= 0
    assert np.allclose(scores.sum(axis=1), 1.0, atol=1e-12)
    single = doc_zoom(M, qd, qe, replace(exact, walk_dtype="float32"))  # the default state type
    assert single.min() >= 0 and np.allclose(single.sum(axis=1), 1.0, atol=1e-5)
    # with dangling nodes mass can only leak, never appear
    dd, de, qd, qe = random_problem(seed, connected=False)
    scores = doc_zoom(global_block(dd, de)[0], qd, qe, replace(exact, rescale="nonzero_mean"))
    assert scores.min() >= 0 and scores.sum(axis=1).max() <= 1.0 + 1e-12


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), coupled=st.booleans())
def test_relabelling_nodes_permutes_scores(seed, coupled):
    dd, de, qd, qe = random_problem(seed)
    M, _ = global_block(dd, de)
    H, _ = query_links(qd, qe)
    perm = np.random.default_rng(seed).permutation(M.shape[0])
    walk = coupled_walk if coupled else decoupled_walk
    base = walk(M, H, 0.8, 5)
    moved = walk(M[perm][:, perm], H[:, perm], 0.8, 5)
    assert np.allclose(moved[:, 0], base[:, 0], atol=1e-12)
    assert np.allclose(moved[:, 1:], base[:, 1:][:, perm], atol=1e-12)


def test_one_step_ranks_docs_as_dense_retrieval():
    """T=1: r(1) = (1-alpha) H~ + alpha e_q, so doc scores are proportional to the kept exp(cos)."""
    rng = np.random.default_rng(7)
    docs, queries = unit_rows(rng, 400, 16), unit_rows(rng, 6, 16)
    de = sp.csr_array((rng.random((400, 50)) < 0.05).astype(float))
    qe = sp.csr_array((rng.random((6, 50)) < 0.1).astype(float))
    M, _ = global_block(doc_doc_block(docs), de)
    qd = query_doc_block(queries @ docs.T, 3.0)
    params = ZoomParams(steps=1)
    scores = doc_zoom(M, qd, qe, params)
    H, _ = query_links(qd, qe)
    Hd = H.toarray()
    assert np.allclose(scores[:, 1:], (1 - params.alpha) * Hd / Hd.sum(axis=1, keepdims=True))
    cos = queries @ docs.T
    for i in range(6):
        kept = qd[[i]].indices
        by_walk = kept[np.argsort(-scores[i, 1 + kept], kind="stable")]
        assert np.array_equal(by_walk, kept[np.argsort(-cos[i, kept], kind="stable")])
        assert set(kept) == set(np.argsort(-cos[i])[: len(kept)])  # kept = dense top-|kept|
    # breaking the zero-score ties by dense similarity reproduces the dense top-k exactly
    ranked = top_docs(scores, 400, 10, tie_break=cos)
    assert np.array_equal(ranked, np.argsort(-cos, axis=1, kind="stable")[:, :10])


# ---------------------------------------------------------------- ChunkZoom


def local_problem(seed: int, l: int = 12, h: int = 6, d: int = 8):
    rng = np.random.default_rng(seed)
    emb = unit_rows(rng, l, d)
    doc = np.sort(rng.integers(0, 3, l))
    pos = np.concatenate([np.arange((doc == k).sum()) for k in range(3)])
    ce = (rng.random((l, h)) < 0.3).astype(float)
    ce[rng.integers(0, l, h), np.arange(h)] = 1.0  # every entity sits in some chunk
    return emb, doc, pos, ce, rng.random(h)


def reference_local_graph(emb, doc, pos, ce, sigma, omega):
    """Eq. (4) written out entry by entry, blocks rescaled so their non-zeros average 1."""
    l, h = ce.shape
    T, S = np.zeros((l, l)), np.zeros((l, l))
    for i in range(l):
        for j in range(l):
            if i != j:
                S[i, j] = math.exp(float(emb[i] @ emb[j]))
                if doc[i] == doc[j]:
                    T[i, j] = math.exp(-((pos[i] - pos[j]) ** 2) / (2 * sigma**2))
    nm = lambda a: a / np.where(a.sum(0) > 0, a.sum(0), 1.0)  # noqa: E731
    cc = omega * nm(T) + (1 - omega) * nm(S)
    cc = cc / cc[cc != 0].mean()
    return np.block([[cc, ce], [ce.T, np.zeros((h, h))]])


def test_chunk_zoom_matches_entrywise_reference():
    emb, doc, pos, ce, y_ent = local_problem(8)
    params = ZoomParams(sigma=1.5, omega=0.3)
    B = reference_local_graph(emb, doc, pos, ce, params.sigma, params.omega)
    P = B / B.sum(axis=0)
    y0 = np.concatenate([np.zeros(len(doc)), y_ent])
    ref = params.beta * np.linalg.solve(np.eye(len(y0)) - (1 - params.beta) * P, y0)
    assert np.abs(chunk_zoom(emb, doc, pos, ce, y_ent, params) - ref).max() < 1e-10


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_equals_many_iterations_of_eq5(seed):
    emb, doc, pos, ce, y_ent = local_problem(seed)
    closed = chunk_zoom(emb, doc, pos, ce, y_ent, ZoomParams())
    iterated = chunk_zoom(emb, doc, pos, ce, y_ent, ZoomParams(closed_form=False, chunk_iterations=300))
    assert np.abs(closed - iterated).max() < 1e-6
    few = chunk_zoom(emb, doc, pos, ce, y_ent, ZoomParams(closed_form=False, chunk_iterations=1))
    assert np.abs(closed - few).max() > 1e-6  # the ablation really is a different operator


@pytest.mark.parametrize("seed", range(3))
def test_chunk_zoom_preserves_mass_and_is_nonnegative(seed):
    emb, doc, pos, ce, y_ent = local_problem(seed)
    y = chunk_zoom(emb, doc, pos, ce, y_ent, ZoomParams())
    assert y.min() >= 0
    assert y.sum() == pytest.approx(y_ent.sum(), rel=1e-12)


def test_chunk_chunk_switches_and_same_document_temporal_edges():
    emb, doc, pos, _, _ = local_problem(9)
    valid = np.ones(len(doc), dtype=bool)
    kw = dict(sigma=1.0, omega=0.5)
    assert not chunk_chunk_block(emb, doc, pos, valid, use_semantic=False, use_temporal=False, **kw).any()
    t = chunk_chunk_block(emb, doc, pos, valid, use_semantic=False, **kw)
    assert np.array_equal(t != 0, (doc[:, None] == doc[None, :]) & ~np.eye(len(doc), dtype=bool))
    assert np.allclose(t.sum(axis=0)[np.bincount(doc)[doc] > 1], 1.0)  # nm(.) is column-wise
    both = chunk_chunk_block(emb, doc, pos, valid, **kw)
    assert np.allclose(both.sum(axis=0), 1.0) and np.all(np.diag(both) == 0)


def corpus_problem(seed: int, n_docs: int = 15, m: int = 25, q: int = 5, d: int = 8):
    rng = np.random.default_rng(seed)
    chunk_doc = rng.permutation(np.repeat(np.arange(n_docs), rng.integers(1, 6, n_docs)))
    C = len(chunk_doc)
    chunk_pos = np.zeros(C, dtype=np.int64)
    for k in range(n_docs):
        chunk_pos[chunk_doc == k] = np.arange((chunk_doc == k).sum())
    chunk_ent = sp.csr_array((rng.random((C, m)) < 0.15).astype(float))
    doc_ids = np.stack([rng.choice(n_docs, 4, replace=False) for _ in range(q)])
    doc_ids[0, -1] = -1  # fewer than K documents for one query
    return doc_ids, chunk_doc, chunk_pos, unit_rows(rng, C, d), chunk_ent, rng.random((q, m))


def test_gather_chunks_matches_loop():
    doc_ids, chunk_doc, *_ = corpus_problem(10)
    got = gather_chunks(doc_ids, chunk_doc)
    for i, ids in enumerate(doc_ids):
        want = sorted(c for c in range(len(chunk_doc)) if chunk_doc[c] in set(ids[ids >= 0]))
        assert sorted(got[i][got[i] >= 0]) == want


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("closed_form", [True, False])
@pytest.mark.parametrize("rescale", ["nonzero_mean", "all_mean"])
def test_batched_padded_solve_equals_per_query_solve(seed, closed_form, rescale):
    doc_ids, chunk_doc, chunk_pos, emb, chunk_ent, ent_scores = corpus_problem(seed)
    params = ZoomParams(closed_form=closed_form, rescale=rescale, sigma=2.0, omega=0.4)
    res = chunk_zoom_batch(doc_ids, chunk_doc, chunk_pos, emb, chunk_ent, ent_scores, params)
    for i in range(len(doc_ids)):
        chunks = res.chunks[i][res.chunks[i] >= 0]
        ents = np.unique(chunk_ent[chunks].tocoo().col)
        local_ce = chunk_ent[chunks][:, ents].toarray()
        y = chunk_zoom(emb[chunks], chunk_doc[chunks], chunk_pos[chunks], local_ce, ent_scores[i, ents], params)
        assert np.array_equal(res.entities[i][: len(ents)], ents)
        assert np.abs(res.scores[i][: len(chunks)] - y[: len(chunks)]).max() < 1e-10
        assert np.abs(res.entity_scores[i][: len(ents)] - y[len(chunks) :]).max() < 1e-10
        assert np.all(np.isneginf(res.scores[i][len(chunks) :]))
        assert res.keep[i].sum() == math.ceil(0.7 * len(chunks))


def test_keep_top_chunks_keeps_best_seventy_percent():
    scores = np.array([[0.1, 0.5, 0.3, 0.2, -np.inf], [0.4, 0.1, 0.2, 0.9, 0.3]])
    keep = keep_top_chunks(scores, np.array([4, 5]), 0.7)
    assert keep[0].tolist() == [False, True, True, True, False]  # ceil(2.8) = 3
    assert keep[1].tolist() == [True, False, True, True, True]  # ceil(3.5) = 4: all but the lowest


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n", [60, 1009])
def test_top_docs_equals_full_lexsort(seed, n):
    rng = np.random.default_rng(seed)
    q = 7
    scores = np.zeros((q, 1 + n))
    scores[:, 1:] = np.where(rng.random((q, n)) < 0.3, rng.integers(0, 4, (q, n)) / 4, 0.0)  # many ties
    scores[1, 1:] = rng.random(n)  # no ties
    scores[2, 1:] = 0.5  # all tied
    scores[3, 1:] = np.sort(rng.random(n))  # the best at the end, in the last block
    cos = np.round(rng.random((q, n)), 1)  # ties in the tie-break too
    for k in [1, 5, 10, 60]:
        want = np.lexsort((-cos, -scores[:, 1:]), axis=1)[:, :k]
        np.testing.assert_array_equal(top_docs(scores, n, k, tie_break=cos), want)
        np.testing.assert_array_equal(top_docs(scores, n, k), np.lexsort((-scores[:, 1:],), axis=1)[:, :k])


# ------------------------------------------------------------- the title walk (beyond the paper)

def _title_corpus():
    """Docs 0 (about a, names b), 1 (about b), 2 and 3 (distractors naming a hub h and each other's topic)."""
    from tasks.methods.zoomrag.algorithm import global_block

    D = sp.csr_array(np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1]], dtype=np.float64))  # entities a, b, h
    doc_doc = sp.csr_array(np.array([[0, 0, 1.2, 1.1], [0, 0, 0, 0], [1.2, 0, 0, 1.3], [1.1, 0, 1.3, 0]]))
    M, _ = global_block(doc_doc, D)
    titled = sp.csr_array(np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=np.float64))  # a->0, b->1
    return M, titled, np.array([0.5, 0.8, 0.1])


def test_title_walk_block_defaults_are_the_papers_M_and_hand_example():
    from tasks.methods.zoomrag.algorithm import title_walk_block

    M, titled, idf = _title_corpus()
    assert abs(title_walk_block(M, 4, titled, idf) - M).max() == 0
    T = title_walk_block(M, 4, titled, idf, title_edge_weight=5.0, title_name_weight=3.0, idf_edges=True)
    Md, Td = M.toarray(), T.toarray()
    np.testing.assert_array_equal(Td[:4, :4], Md[:4, :4])  # doc-doc untouched
    np.testing.assert_allclose(Td[:4, 4:], Md[:4, 4:] + 5.0 * titled.toarray().T)  # entity -> titled doc, one way
    np.testing.assert_allclose(Td[4:, :4], Md[4:, :4] * np.array([1.5, 2.4, 0.1])[:, None])  # tf * idf rows
    assert abs(Td[4:, 4:]).max() == 0


def test_title_walk_block_lowercase_names_weigh_less():
    from tasks.methods.zoomrag.algorithm import title_walk_block

    M, titled, idf = _title_corpus()
    lowercase = sp.csr_array(([1.0], ([0], [1])), shape=(4, 3))  # doc 0 writes b only in lower case
    base = title_walk_block(M, 4, titled, idf, 5.0, 3.0, True).toarray()
    T = title_walk_block(M, 4, titled, idf, 5.0, 3.0, True, lowercase, 0.1).toarray()
    assert T[4 + 1, 0] == pytest.approx(0.1 * base[4 + 1, 0]) and base[4 + 1, 0] > 0  # the edge doc 0 -> b
    T[4 + 1, 0] = base[4 + 1, 0]
    np.testing.assert_array_equal(T, base)


def test_title_walk_brings_the_bridge_document_into_the_top_two():
    """The question names a (doc 0's title); doc 0 names b, the title of doc 1, which the question does not
    resemble. With the title walk doc 1 is second; on the paper's M a distractor is."""
    from tasks.methods.zoomrag.algorithm import title_walk_block

    M, titled, idf = _title_corpus()
    query_doc = sp.csr_array(np.array([[np.exp(0.6), 0.0, np.exp(0.5), np.exp(0.55)]]))
    query_entity = sp.csr_array(np.array([[0.5, 0.0, 0.0]]))
    params = ZoomParams(alpha=0.2, steps=5)  # a longer walk than the paper's alpha 0.8: the bridge is 3 hops out
    paper = doc_zoom(M, query_doc, query_entity, params, weighted_entities=True)[0, 1:5]
    T = title_walk_block(M, 4, titled, idf, 50.0, 10.0, True)
    beyond = doc_zoom(T, query_doc, query_entity, params, weighted_entities=True)[0, 1:5]
    assert list(np.argsort(-beyond)[:2]) == [0, 1]
    assert 1 not in np.argsort(-paper)[:2]


def test_query_entity_weight_scales_only_the_rescaled_entity_block():
    qd = sp.csr_array(np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]]))
    qe = sp.csr_array(np.array([[1.0, 0.0], [0.0, 1.0]]))
    H1 = query_links(qd, qe)[0].toarray()
    H5 = query_links(qd, qe, entity_weight=5.0)[0].toarray()
    np.testing.assert_array_equal(H5[:, :3], H1[:, :3])
    np.testing.assert_allclose(H5[:, 3:], 5.0 * H1[:, 3:])


# ---------------------------------------------------------------- the relation gate (beyond the paper)


def _gated_problem(seed: int):
    """A random M (after the title walk) whose first entities title documents, chunks naming them, questions."""
    from tasks.methods.zoomrag.algorithm import title_walk_block

    rng = np.random.default_rng(seed)
    n, m, q, d = 30, 20, 7, 8
    dd, de, qd, qe = random_problem(seed, n=n, m=m, q=q, connected=True)
    titled = sp.csr_array((np.ones(10), (np.arange(10), rng.choice(n, 10, replace=False))), shape=(m, n))
    n_chunks = 3 * n
    chunk_doc = np.repeat(np.arange(n), 3)
    de = de.tolil()
    ce = sp.random_array((n_chunks, m), density=0.15, rng=rng, format="coo")
    de[chunk_doc[ce.row], ce.col] = 1.0  # every chunk's names are its document's
    M, _ = global_block(dd, sp.csr_array(de))
    M = title_walk_block(M, n, titled, np.full(m, 0.7), 5.0, 3.0, False)
    return (M, n, titled, sp.csr_array((np.ones(ce.nnz), (ce.row, ce.col)), shape=(n_chunks, m)), chunk_doc,
            unit_rows(rng, n_chunks, d), unit_rows(rng, q, d), qd, qe)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_relation_gate_weights_match_a_loop_and_keep_each_documents_total(seed, temperature):
    from tasks.methods.zoomrag.algorithm import gate_patch, relation_gate

    M, n, titled, ce, chunk_doc, chunk_emb, q_emb, _, _ = _gated_problem(seed)
    gate = relation_gate(M, n, titled, ce, chunk_doc, chunk_emb, temperature)
    patch = gate_patch(gate, q_emb)
    Md, T, C = M.toarray(), titled.toarray(), ce.toarray()
    pairs = sorted({(int(chunk_doc[c]), int(e)) for c, e in zip(*np.nonzero(C))
                    if T[e].any() and not T[e, chunk_doc[c]] and Md[n + e, chunk_doc[c]] > 0})
    assert [(int(p), int(e) - n) for p, e in zip(patch.src, patch.dst)] == pairs
    # float64 reference cosines; the gate's are float32 products, whose rounding (about 1e-7, and it depends on
    # the BLAS kernel the shapes pick) divided by a small temperature bounds the agreement at about 1e-6
    sims = np.asarray(q_emb, np.float64) @ np.asarray(chunk_emb, np.float64).T
    for i in range(q_emb.shape[0]):
        for p in {p for p, _ in pairs}:
            ents = [e for pp, e in pairs if pp == p]
            w = np.array([Md[n + e, p] for e in ents])
            s = np.array([max(float(sims[i, c]) for c in np.flatnonzero((chunk_doc == p) & (C[:, e] > 0)))
                          for e in ents])
            share = w * np.exp(s / temperature)
            want = w.sum() * share / share.sum()
            got = np.array([Md[n + e, p] + patch.delta[i, pairs.index((p, e))] for e in ents])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12)
    for p in np.unique(patch.src):  # each document's gated weights keep their total: eq. (7)'s sums are M's
        np.testing.assert_allclose(patch.delta[:, patch.src == p].sum(axis=1), 0.0, atol=1e-12)


@pytest.mark.parametrize("node_order", ["stored", "locality"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gated_walk_equals_explicit_walks_on_each_questions_own_matrix(node_order, dtype):
    """Each question walks on M + its patch: the batched walk equals the one-query eq. (3) walk on that matrix."""
    from tasks.methods.zoomrag.algorithm import gate_patch, relation_gate

    M, n, titled, ce, chunk_doc, chunk_emb, q_emb, qd, qe = _gated_problem(4)
    gate = relation_gate(M, n, titled, ce, chunk_doc, chunk_emb, 0.1)
    params = ZoomParams(alpha=0.3, steps=6, batch_size=3, walk_dtype=dtype, walk_node_order=node_order)
    got = doc_zoom(walk_graph(M, node_order, dtype), qd, qe, params, gate=gate, q_emb=q_emb)
    plain = doc_zoom(walk_graph(M, node_order, dtype), qd, qe, params)
    H, _ = query_links(qd, qe)
    ref = []
    for i, h in enumerate(H.toarray()):  # the patch of i's walk batch (float32 cosines round by batch shape)
        start = i - i % params.batch_size
        patch = gate_patch(gate, q_emb[start:start + params.batch_size])
        Mi = M.toarray()
        Mi[patch.dst, patch.src] += patch.delta[i - start]
        ref.append(explicit_walk(Mi, h, params.alpha, params.steps))
    assert np.abs(got - np.stack(ref)).max() < (1e-6 if dtype == "float32" else 1e-12)
    assert np.abs(got - plain).max() > 1e-3  # the gate changes the walk
    with pytest.raises(ValueError, match="embeddings"):
        doc_zoom(M, qd, qe, params, gate=gate)


def test_relation_gate_sends_the_walk_to_the_title_the_question_asks_about():
    """Doc 0 (about a) names b in one sentence and c in another, which reads like the question. The title walk
    alone scores b's and c's documents alike; with the gate, c's document comes first."""
    from tasks.methods.zoomrag.algorithm import relation_gate, title_walk_block

    D = sp.csr_array(np.array([[1, 1, 1], [0, 1, 0], [0, 0, 1]], dtype=np.float64))  # entities a, b, c
    M, _ = global_block(sp.csr_array((3, 3)), D)
    titled = sp.csr_array(np.eye(3))  # a, b, c title docs 0, 1, 2
    M = title_walk_block(M, 3, titled, np.ones(3), 50.0, 10.0, False)
    chunk_doc = np.array([0, 0, 0, 1, 2])
    ce = sp.csr_array(np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0], [0, 0, 1]], dtype=np.float64))
    chunk_emb = np.array([[1, 0, 0], [0, 1, 0], [0, 0.6, 0.8], [0, 1, 0], [0, 0, 1]], dtype=np.float32)
    q_emb = np.array([[0.6, 0.0, 0.8]], dtype=np.float32)  # close to the sentence naming c
    query_doc = sp.csr_array(np.array([[np.exp(0.6), np.exp(0.1), np.exp(0.1)]]))
    query_entity = sp.csr_array(np.array([[1.0, 0.0, 0.0]]))
    params = ZoomParams(alpha=0.1, steps=10, query_entity_weight=10.0)
    plain = doc_zoom(M, query_doc, query_entity, params, weighted_entities=True)[0, 1:4]
    gate = relation_gate(M, 3, titled, ce, chunk_doc, chunk_emb, 0.1)
    gated = doc_zoom(M, query_doc, query_entity, params, weighted_entities=True, gate=gate, q_emb=q_emb)[0, 1:4]
    assert plain[1] == pytest.approx(plain[2], rel=1e-6)  # M's D is 0/1: the walk alone cannot tell b from c
    assert gated[2] == gated.max() and gated[2] > 5 * gated[1]


def test_a_query_that_eq2_links_to_no_document_links_to_its_best_one():
    """On 10 documents or fewer no cosine lies 3 std above the row mean, so eq. 2 keeps nothing; the best document
    is linked instead (beyond the paper), and rows that keep something are left as eq. 2 made them."""
    rng = np.random.default_rng(0)
    one = np.array([[0.3], [0.8]])
    assert query_doc_block(one, 3.0, best_when_none=False).nnz == 0
    got = query_doc_block(one, 3.0).toarray()
    np.testing.assert_allclose(got, np.exp(one))
    cos = rng.normal(size=(6, 400))
    cos[0, 17] = 50.0  # one row with a clear outlier: eq. 2 keeps it alone
    few = rng.normal(size=(6, 7))
    np.testing.assert_array_equal(query_doc_block(cos, 3.0).toarray()[0], query_doc_block(cos, 3.0, False).toarray()[0])
    kept = query_doc_block(few, 3.0).toarray()
    assert (kept > 0).sum(axis=1).tolist() == [1] * 6
    np.testing.assert_array_equal(kept.argmax(axis=1), few.argmax(axis=1))
