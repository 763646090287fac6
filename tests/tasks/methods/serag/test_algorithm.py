"""SeRAG equations on small graphs with answers worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tasks.graph.sparse import log1p_transposed
from tasks.methods.serag import algorithm as se


def _unit(rng, n, d=8):
    x = rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_distance_layer_never_links_different_documents():
    doc = np.array([0, 0, 0, 1, 1, 2])
    pos = np.array([0, 1, 2, 0, 1, 0])
    w = se.distance_layer(doc, pos, sigma=5.0, window=10).toarray()
    for i in range(6):
        for j in range(6):
            if doc[i] != doc[j] or i == j:
                assert w[i, j] == 0
    assert w[0, 2] == pytest.approx(np.exp(-4 / 50))
    assert w[3, 4] == pytest.approx(np.exp(-1 / 50))
    np.testing.assert_array_equal(w, w.T)


def test_distance_layer_window():
    doc = np.zeros(15, dtype=int)
    w = se.distance_layer(doc, np.arange(15), sigma=5.0, window=10).toarray()
    assert w[0, 10] > 0 and w[0, 11] == 0


def test_logical_layer_eq4_and_cap():
    # chunk 0: {a, b}; chunk 1: {a}; chunk 2: {b, c, d}; entity x in every chunk
    inc = np.array([[1, 1, 0, 0, 1], [2, 0, 0, 0, 1], [0, 1, 1, 1, 1]], dtype=float)
    w = se.logical_layer(sp.csr_array(inc), max_entity_chunks=None).toarray()
    assert w[0, 1] == pytest.approx(2 / 3)  # {a, x} shared, max(3, 2)
    assert w[0, 2] == pytest.approx(2 / 4)
    capped = se.logical_layer(sp.csr_array(inc), max_entity_chunks=2).toarray()  # x (3 chunks) links nothing
    assert capped[0, 1] == pytest.approx(1 / 3)
    assert capped[0, 2] == pytest.approx(1 / 4)
    assert capped[1, 2] == 0
    assert np.all(np.diag(capped) == 0)


def test_graph_symmetric_zero_diagonal_nonnegative():
    rng = np.random.default_rng(0)
    emb = _unit(rng, 30)
    inc = sp.csr_array((rng.random((30, 12)) < 0.2).astype(float))
    doc = np.repeat(np.arange(10), 3)
    pos = np.tile(np.arange(3), 10)
    w, counts = se.multi_perspective_graph(emb, inc, doc, pos, se.GraphParams(k_sem=5))
    d = w.toarray()
    np.testing.assert_allclose(d, d.T)
    assert np.all(np.diag(d) == 0) and d.min() >= 0
    assert counts["dist_nnz"] == 10 * 6
    only = se.multi_perspective_graph(emb, inc, doc, pos, se.GraphParams(k_sem=5, semantic_only=True))[0]
    assert only.nnz <= counts["sem_nnz"]


def test_semantic_layer_by_inverted_file_is_exact_with_every_cell_probed_and_auto_switches_at_the_limit():
    emb = _unit(np.random.default_rng(4), 800)
    exact = se.semantic_layer(emb, 6)
    full = se.semantic_layer(emb, 6, "ivf", ivf_nlist=10, ivf_nprobe=10)
    assert np.array_equal(exact.toarray() != 0, full.toarray() != 0)
    assert np.abs(exact - full).max() < 1e-5
    few = se.semantic_layer(emb, 6, "ivf", ivf_nlist=10, ivf_nprobe=1)
    assert (few != 0).multiply(exact != 0).sum() < exact.nnz  # approximate: some true neighbours missed
    assert (se.semantic_layer(emb, 6, "auto", exact_max=800) != exact).nnz == 0
    assert (se.semantic_layer(emb, 6, "auto", exact_max=799, ivf_nlist=10, ivf_nprobe=1) != few).nnz == 0
    with pytest.raises(ValueError, match="kNN search"):
        se.GraphParams(knn_search="hnsw")


def test_structural_weight_by_hand():
    # path 0-1-2 (unit weights) as one community, 3-4 (weight 2) a second one, 5 isolated singleton
    adj = sp.csr_array(np.array([
        [0, 1, 0, 0, 0, 0], [1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 2, 0], [0, 0, 0, 2, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=float))
    w = se.structural_weight(adj, np.array([0, 0, 0, 1, 1, 2]))
    def h(p: float) -> float:
        return -p * np.log2(p)

    np.testing.assert_allclose(w, [h(0.25), h(0.5), h(0.25), 0.5, 0.5, 0.0])


def test_consolidation_singleton_is_own_vector_and_weighted_mean():
    rng = np.random.default_rng(1)
    emb = _unit(rng, 4)
    community = np.array([0, 0, 1, 0])
    weight = np.array([1.0, 3.0, 0.0, 0.0])
    h = se.consolidate(emb, community, weight, 2)
    np.testing.assert_allclose(h[1], emb[2], atol=1e-6)
    want = emb[0] * 0.25 + emb[1] * 0.75
    np.testing.assert_allclose(h[0], want / np.linalg.norm(want), atol=1e-6)


def test_entity_bonus_gate_and_count():
    sim = sp.csr_array(np.array([[1.0, 0.8, 0.9]]))
    counts = sp.csr_array(np.array([[2.0, 5.0, 0.0], [0.0, 1.0, 3.0]]))
    b = se.entity_bonus(sim, counts, tau=0.85)
    np.testing.assert_allclose(b, [[np.log(3), 0.9 * np.log(4)]])


def test_hybrid_scores_eq10_and_filter():
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    chunks = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    comm = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    community = np.array([0, 1, 1])
    bonus = np.array([[0.0, 0.0, 1.0]])
    s, cand = se.hybrid_scores(q, chunks, comm, community, bonus, se.ScoreParams(k_coarse=1))
    np.testing.assert_allclose(s, [[0.4 + 0.6, 0.0, 0.6 * (0.6 + np.log(2))]], atol=1e-6)
    np.testing.assert_array_equal(cand, [[True, False, False]])
    order = se.rank_chunks(s, cand)
    np.testing.assert_array_equal(order, [[0, 2, 1]])  # fallback beyond the candidates, by score
    single, all_ = se.hybrid_scores(q, chunks, comm, community, bonus, se.ScoreParams(single_layer=True))
    assert all_.all()
    np.testing.assert_allclose(single, 0.6 * (q @ chunks.T + np.log1p(bonus)), atol=1e-6)


def test_entity_bonus_divided_by_the_query_gated_entities():
    # query 0 gates in entities 0 and 2 (0.8 is below τ), query 1 none: B / 2 and B unchanged (0)
    sim = sp.csr_array(np.array([[1.0, 0.8, 0.9], [0.5, 0.0, 0.0]]))
    counts = sp.csr_array(np.array([[2.0, 5.0, 0.0], [0.0, 1.0, 3.0]]))
    b = se.entity_bonus(sim, counts, tau=0.85, norm="query_entities")
    np.testing.assert_allclose(b, [[np.log(3) / 2, 0.9 * np.log(4) / 2], [0.0, 0.0]])
    np.testing.assert_allclose(b[0] * 2, se.entity_bonus(sim, counts, tau=0.85)[0])


def test_soft_community_filter_keeps_eq10_and_ranks_every_chunk():
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    chunks = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    comm = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    community = np.array([0, 1, 1])
    bonus = np.array([[0.0, 0.0, 3.0]])
    hard, cand = se.hybrid_scores(q, chunks, comm, community, bonus, se.ScoreParams(k_coarse=1))
    soft, every = se.hybrid_scores(q, chunks, comm, community, bonus,
                                   se.ScoreParams(k_coarse=1, community_filter="soft"))
    np.testing.assert_allclose(soft, hard)  # the same S(q, v), γ_c term included
    assert every.all() and not cand.all()
    # chunk 2 (outside the top community, its bonus above chunk 0's score) leads only without the cut
    assert se.rank_chunks(hard, cand)[0, 0] == 0 and se.rank_chunks(soft, every)[0, 0] == 2


def test_batched_retrieval_equals_one_query_at_a_time():
    rng = np.random.default_rng(2)
    chunks, queries = _unit(rng, 40), _unit(rng, 7)
    community = rng.integers(0, 12, 40)
    comm = se.consolidate(chunks, community, rng.random(40), 12)
    counts = sp.csr_array((rng.random((40, 9)) < 0.3) * rng.integers(1, 4, (40, 9)).astype(float))
    sim = sp.csr_array((rng.random((7, 9)) < 0.3) * rng.uniform(0.8, 1.0, (7, 9)))
    chunk_doc = np.arange(40) // 2
    p = se.ScoreParams(k_coarse=3)

    def run(qe, qs):
        s, c = se.hybrid_scores(qe, chunks, comm, community, se.entity_bonus(qs, counts, p.tau), p)
        return s, se.rank_documents(se.rank_chunks(s, c), chunk_doc, 20, 10)

    s_all, d_all = run(queries, sim)
    for i in range(7):
        s_i, d_i = run(queries[i:i + 1], sim[[i]])
        np.testing.assert_allclose(s_i[0], s_all[i], atol=1e-6)  # float32 matmul blocking
        np.testing.assert_array_equal(d_i[0], d_all[i])


def test_rank_documents_best_chunk():
    order = np.array([[3, 0, 1, 2]])
    np.testing.assert_array_equal(se.rank_documents(order, np.array([0, 0, 1, 2]), 3, 3), [[2, 0, 1]])


def test_query_entity_similarity_gates_and_takes_max():
    vocab = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    names = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])  # query 0 has two entities, query 1 one
    sim = se.query_entity_similarity(names, np.array([0, 0, 1]), vocab, 3, tau=0.85, block_rows=1).toarray()
    np.testing.assert_allclose(sim, [[1.0, 0.0, 0.96], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def _rank_chunks_two_sorts(scores, candidates):  # the original two-argsort form
    order = np.argsort(-scores, axis=1, kind="stable")
    outside = ~np.take_along_axis(candidates, order, axis=1)
    return np.take_along_axis(order, np.argsort(outside, axis=1, kind="stable"), axis=1)


def _rank_documents_ufunc_at(chunk_order, chunk_doc, n_docs, k):  # the original np.minimum.at form
    q, n = chunk_order.shape
    best = np.full((q, n_docs), n, dtype=np.int64)
    np.minimum.at(best, (np.repeat(np.arange(q), n), chunk_doc[chunk_order.ravel()]), np.tile(np.arange(n), q))
    return np.argsort(best, axis=1, kind="stable")[:, :min(k, n_docs)]


def test_vectorised_ranking_equals_the_elementwise_forms_with_ties_and_empty_passages():
    rng = np.random.default_rng(5)
    for _ in range(200):
        q, n, n_docs = rng.integers(1, 5), rng.integers(1, 30), rng.integers(1, 25)
        chunk_doc = rng.integers(0, n_docs, n)  # several chunks a passage, some passages without any
        scores = rng.integers(0, 4, (q, n)).astype(float)  # many ties
        cand = rng.random((q, n)) < 0.5
        order = se.rank_chunks(scores, cand)
        np.testing.assert_array_equal(order, _rank_chunks_two_sorts(scores, cand))
        for k in (1, 3, 10, 40):
            want = _rank_documents_ufunc_at(order, chunk_doc, n_docs, k)
            np.testing.assert_array_equal(se.rank_documents(order, chunk_doc, n_docs, k), want)
            np.testing.assert_array_equal(se.top_documents(scores, cand, chunk_doc, n_docs, k), want)
        best = np.full((q, n_docs), -np.inf)
        np.maximum.at(best, (np.repeat(np.arange(q), n), np.tile(chunk_doc, q)), scores.ravel())
        np.testing.assert_array_equal(se.segment_reduce(scores, chunk_doc, n_docs, np.maximum, -np.inf), best)
        one_each = rng.permutation(n_docs)[:n] if n <= n_docs else None  # one column per group, in any order
        if one_each is not None:
            want = np.full((q, n_docs), -np.inf)
            want[:, one_each] = scores
            np.testing.assert_array_equal(se.segment_reduce(scores, one_each, n_docs, np.maximum, -np.inf), want)


@pytest.mark.parametrize("seed", range(3))
def test_top_documents_takes_the_fast_path_on_a_large_corpus_and_equals_the_chunk_order(seed):
    """Every query has many passages with a candidate chunk: the top k without the full chunk order."""
    rng = np.random.default_rng(seed)
    q, n, n_docs = 5, 3000, 1000
    chunk_doc = rng.integers(0, n_docs, n)
    scores = np.round(rng.random((q, n)), 2)  # ties across passages
    cand = rng.random((q, n)) < 0.3
    cand[4] = rng.random(n) < 0.002  # one query with fewer than k passages among the candidates
    for k in (1, 10, 50):
        want = _rank_documents_ufunc_at(se.rank_chunks(scores, cand), chunk_doc, n_docs, k)
        np.testing.assert_array_equal(se.top_documents(scores, cand, chunk_doc, n_docs, k), want)


def test_query_entity_similarity_over_shared_rows_equals_one_row_per_pair():
    # pairs pointing at shared name rows == the same names repeated once per pair (the old layout)
    rng = np.random.default_rng(3)
    vocab = _unit(rng, 40, d=4)
    for _ in range(50):
        u, q = rng.integers(1, 8), rng.integers(1, 6)
        names = np.vstack([vocab[rng.integers(0, 40, u // 2)], _unit(rng, u - u // 2, d=4)])
        n_pairs = rng.integers(0, 12)
        owner, row = rng.integers(0, q, n_pairs), rng.integers(0, u, n_pairs)
        shared = se.query_entity_similarity(names, owner, vocab, q, tau=0.6, block_rows=3, name_row=row)
        repeated = se.query_entity_similarity(names[row], owner, vocab, q, tau=0.6)
        assert shared.shape == (q, 40)
        np.testing.assert_allclose(shared.toarray(), repeated.toarray(), rtol=1e-6)  # BLAS blocks may round apart
        # by definition: max over the query's names of the gated cosine
        dense = np.zeros((q, 40))
        for o, r in zip(owner, row):
            cos = names[r] @ vocab.T
            dense[o] = np.maximum(dense[o], np.where(cos > 0.6, cos, 0.0))
        np.testing.assert_allclose(shared.toarray(), dense, rtol=1e-6)


def test_gated_similarity_keeps_only_values_above_tau():
    vocab = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    g = se.gated_similarity(np.array([[0.8, 0.6]]), vocab, tau=0.85).toarray()
    np.testing.assert_allclose(g, [[0.0, 0.0, 0.96]])
    assert se.gated_similarity(np.zeros((0, 2)), vocab, tau=0.5).shape == (0, 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kept_log_counts_and_the_vocabulary_side_product_give_the_same_bonus(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vocab = rng.standard_normal((400, 16)).astype(np.float32)
    vocab /= np.linalg.norm(vocab, axis=1, keepdims=True)
    names = vocab[rng.choice(400, 5)] + 0.1 * rng.standard_normal((5, 16)).astype(np.float32)
    names /= np.linalg.norm(names, axis=1, keepdims=True)
    gated = se.gated_similarity(names, vocab, tau=0.5, block_rows=2).toarray()
    plain = names.astype(np.float64) @ vocab.T.astype(np.float64)
    np.testing.assert_allclose(gated, np.where(plain > 0.5, plain, 0.0), atol=1e-5)
    assert (gated > 0).sum() >= 5  # each name matches at least the entity it was drawn from
    counts = sp.csr_array(np.where(rng.random((30, 400)) < 0.05, rng.integers(1, 4, (30, 400)), 0))
    sim = sp.csr_array(np.where(rng.random((4, 400)) < 0.1, rng.random((4, 400)), 0.0))
    np.testing.assert_array_equal(se.entity_bonus(sim, counts, 0.5),
                                  se.entity_bonus(sim, counts, 0.5, log1p_transposed(counts)))
