"""Tests for tasks/graph/walk.py: oracles (networkx PageRank, one query at a time, the closed form vs many
iterations), properties (a distribution, relabelling)."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.graph.walk import (
    column_normalise,
    inverse_column_sums,
    alternating_walk,
    personalized_pagerank,
    restart_columns,
    random_walk,
    restarted_walk,
    stationary_walk,
)
from tasks.methods.zoomrag import algorithm as zoom


def random_bipartite(seed: int, n_p: int = 9, n_e: int = 14, directed: bool = False):
    """Random weighted passage-entity graph with a few isolated (dangling) nodes."""
    rng = np.random.default_rng(seed)
    graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_nodes_from(range(n_p + n_e))
    for p in range(n_p - 2):  # the last two passages stay isolated
        for e in range(n_p, n_p + n_e - 1):  # the last entity stays isolated
            if rng.random() < 0.3:
                graph.add_edge(p, e, weight=float(rng.uniform(0.5, 2.0)))
                if directed and rng.random() < 0.5:
                    graph.add_edge(e, p, weight=float(rng.uniform(0.5, 2.0)))
    adj = nx.to_scipy_sparse_array(graph, nodelist=range(n_p + n_e), weight="weight", format="csr")
    return graph, adj, rng


def random_adjacency(seed: int, n: int = 25, density: float = 0.2) -> sp.csr_array:
    """Random non-negative sparse adjacency, a few empty columns included."""
    rng = np.random.default_rng(seed)
    adj = sp.random_array((n, n), density=density, rng=rng, format="csr") * 3
    adj = adj.tolil()
    adj[:, :2] = 0.0  # empty columns: mass reaching nodes 0 and 1 leaks (or restarts, when dangling)
    return sp.csr_array(adj)


def assert_identical(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b), np.abs(a - b).max()


# ---------------------------------------------------------------- transitions


def test_column_normalise_dense_batch_and_sparse():
    rng = np.random.default_rng(11)
    B = rng.random((3, 6, 6))
    B[0, :, 2] = 0.0  # a dangling column stays zero
    P = column_normalise(B)
    assert np.allclose(P[1:].sum(axis=1), 1.0) and not P[0, :, 2].any()
    assert np.allclose(P[0].sum(axis=0)[[0, 1, 3, 4, 5]], 1.0)
    adj = random_adjacency(0)
    Ps = column_normalise(adj)
    assert sp.issparse(Ps) and adj.nnz == Ps.nnz
    sums = np.asarray(Ps.sum(axis=0)).ravel()
    nonempty = inverse_column_sums(adj)[0] > 0
    assert np.allclose(sums[nonempty], 1.0) and not sums[~nonempty].any()
    assert np.allclose(Ps.toarray(), column_normalise(adj.toarray()), atol=1e-15)


def test_random_walk_is_the_transposed_row_normalised_adjacency():
    _, adj, _ = random_bipartite(2, directed=True)
    walk = random_walk(adj)
    A = adj.toarray()
    out = A.sum(axis=1)
    want = np.divide(A, out[:, None], out=np.zeros_like(A), where=out[:, None] > 0).T
    assert np.allclose(walk.matrix.toarray(), want, atol=1e-15)
    assert walk.dangling.tolist() == np.flatnonzero(out == 0).tolist()
    assert np.allclose(walk.matrix.toarray(), column_normalise(adj.T).toarray(), atol=1e-15)


# ---------------------------------------------------------------- the kernel


@pytest.mark.parametrize("dangling", [False, True])
def test_batched_walk_equals_one_query_at_a_time(dangling):
    adj = random_adjacency(1)
    P = column_normalise(adj)
    x0 = np.random.default_rng(1).random((25, 6))
    kw = dict(dangling=np.array([0, 1]) if dangling else None)
    batch = restarted_walk(P, x0, 0.3, 17, **kw)
    for q in range(6):
        one = restarted_walk(P, x0[:, [q]], 0.3, 17, **kw)
        assert np.abs(batch[:, q] - one[:, 0]).max() < 1e-14


def test_a_step_is_the_restarted_walk_equation():
    P = column_normalise(random_adjacency(2))
    x0 = np.random.default_rng(2).random((25, 3))
    x = x0.copy()
    for steps in range(4):
        assert np.allclose(restarted_walk(P, x0, 0.2, steps), x, atol=1e-15)
        x = 0.8 * (P @ x) + 0.2 * x0


def test_callable_operator_equals_the_matrix():
    P = column_normalise(random_adjacency(3))
    x0 = np.random.default_rng(3).random((25, 4))
    assert_identical(restarted_walk(lambda x: P @ x, x0, 0.4, 9), restarted_walk(P, x0, 0.4, 9))


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_equals_many_iterations(seed):
    rng = np.random.default_rng(seed)
    P = column_normalise(rng.random((5, 8, 8)) * (rng.random((5, 8, 8)) < 0.5))  # a batch of local graphs
    x0 = rng.random((5, 8, 2))
    closed = restarted_walk(P, x0, 0.1, 0, closed_form=True)
    assert np.abs(closed - restarted_walk(P, x0, 0.1, 400)).max() < 1e-12
    assert np.abs(closed - restarted_walk(P, x0, 0.1, 3)).max() > 1e-6  # three steps are not the fixed point
    assert_identical(closed, stationary_walk(P, x0, 0.1))
    assert np.allclose(closed, np.stack([stationary_walk(P[i], x0[i], 0.1) for i in range(5)]), atol=1e-14)
    with pytest.raises(ValueError):
        restarted_walk(P, x0, 0.1, 5, closed_form=True, dangling=np.array([0]))


def test_tolerance_stops_early_and_close_to_the_limit():
    P = column_normalise(random_adjacency(4))
    x0 = np.random.default_rng(4).random((25, 3))
    limit = restarted_walk(P, x0, 0.5, 200)
    early = restarted_walk(P, x0, 0.5, 200, tol=1e-6, check_every=4)
    assert 0 < np.abs(early - limit).sum(axis=0).max() < 1e-5
    calls = []
    restarted_walk(lambda x: calls.append(1) or P @ x, x0, 0.5, 200, tol=1e-6, check_every=4)
    assert len(calls) % 4 == 0 and len(calls) < 200  # stops at a check


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), restart=st.floats(0.05, 0.95), steps=st.integers(0, 12))
def test_walk_keeps_mass_and_relabelling_permutes(seed, restart, steps):
    rng = np.random.default_rng(seed)
    cycle = sp.eye_array(15, k=1) + sp.eye_array(15, k=-14)  # every column has an edge: mass is kept exactly
    adj = sp.csr_array(sp.random_array((15, 15), density=0.3, rng=rng) + cycle)
    P = column_normalise(adj)
    x0 = rng.random((15, 3))
    x0 /= x0.sum(axis=0)
    x = restarted_walk(P, x0, restart, steps)
    assert x.min() >= 0 and np.allclose(x.sum(axis=0), 1.0, atol=1e-12)
    perm = rng.permutation(15)
    moved = restarted_walk(column_normalise(adj[perm][:, perm]), x0[perm], restart, steps)
    assert np.allclose(moved, x[perm], atol=1e-12)


# ---------------------------------------------------------------- personalized PageRank


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_ppr_matches_networkx(seed: int, directed: bool) -> None:
    graph, adj, rng = random_bipartite(seed, directed=directed)
    n = adj.shape[0]
    reset = np.where(rng.random((4, n)) < 0.4, rng.random((4, n)), 0.0)
    reset[0, -1] = 1.0  # mass on a dangling node
    reset[:, 0] += 0.1  # no all-zero row (networkx rejects it)
    for damping in (0.5, 0.85):
        ours = personalized_pagerank(adj, reset, damping=damping, tol=1e-14, max_iter=2000)
        for q in range(reset.shape[0]):
            ref = nx.pagerank(graph, alpha=damping, personalization=dict(enumerate(reset[q])),
                              tol=1e-14, max_iter=2000, weight="weight")
            assert np.abs(ours[q] - np.array([ref[i] for i in range(n)])).max() < 1e-6


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n_q=st.integers(1, 5), damping=st.floats(0.05, 0.95))
def test_ppr_batch_equals_single_and_is_a_distribution(seed: int, n_q: int, damping: float) -> None:
    _, adj, rng = random_bipartite(seed)
    reset = rng.random((n_q, adj.shape[0])) * (rng.random((n_q, adj.shape[0])) < 0.5)
    reset[:, 0] += 1e-3
    batch = personalized_pagerank(adj, reset, damping=damping, tol=1e-13, max_iter=1000)
    assert (batch >= 0).all()
    np.testing.assert_allclose(batch.sum(axis=1), 1.0, atol=1e-9)
    for q in range(n_q):
        one = personalized_pagerank(adj, reset[[q]], damping=damping, tol=1e-13, max_iter=1000)
        assert np.abs(batch[q] - one[0]).max() < 1e-6


def test_ppr_float32_is_close_to_float64() -> None:
    _, adj, rng = random_bipartite(7)
    reset = rng.random((4, adj.shape[0]))
    exact = personalized_pagerank(adj, reset, 0.5, 1e-12, 500)
    fast = personalized_pagerank(adj, reset, 0.5, 1e-6, 100, dtype="float32")
    assert fast.dtype == np.float64 and np.abs(fast - exact).sum(axis=1).max() < 1e-5


def test_ppr_all_zero_reset_row_gives_zeros() -> None:
    _, adj, _ = random_bipartite(0)
    reset = np.zeros((2, adj.shape[0]))
    reset[1, 3] = 1.0
    out = personalized_pagerank(adj, reset)
    assert not out[0].any() and out[1].sum() == pytest.approx(1.0)
    assert not personalized_pagerank(adj, reset[:1]).any()


def test_prebuilt_random_walk_gives_the_same_ppr() -> None:
    _, adj, rng = random_bipartite(3)
    reset = rng.random((3, adj.shape[0]))
    walk = random_walk(adj, "float32")
    assert_identical(personalized_pagerank(walk, reset, 0.5, 1e-6, 100, "float32"),
                     personalized_pagerank(adj, reset, 0.5, 1e-6, 100, "float32"))


@pytest.mark.parametrize("seed", range(3))
def test_ppr_sparse_reset_threads_and_node_slice_give_the_same_scores(seed: int) -> None:
    """A sparse reset equals its dense form bit for bit; blocks of queries walked on threads equal one block to
    the stopping tolerance; ``nodes`` returns the first columns of the full result."""
    _, adj, rng = random_bipartite(seed)
    n = adj.shape[0]
    reset = np.where(rng.random((7, n)) < 0.3, rng.random((7, n)), 0.0)
    reset[2] = 0.0  # an all-zero row stays zero whichever form
    reset[4, 1] = -0.5  # negative mass is clipped to 0 in both forms
    dense = personalized_pagerank(adj, reset, 0.5, 1e-6, 100, "float32")
    assert_identical(personalized_pagerank(adj, sp.csr_array(reset), 0.5, 1e-6, 100, "float32"), dense)
    exact = personalized_pagerank(adj, reset, 0.5, 1e-13, 1000)
    for threads in (2, 3, 7, 20):
        blocks = personalized_pagerank(adj, reset, 0.5, 1e-13, 1000, threads=threads)
        assert np.abs(blocks - exact).max() < 1e-10 and not blocks[2].any()
    assert_identical(personalized_pagerank(adj, reset, 0.5, 1e-6, 100, "float32", nodes=5), dense[:, :5])
    # the reset as column blocks side by side (dense, sparse, dense), never joined: the same walk
    cut = [0, 3, n - 2, n]
    sides = [reset[:, a:b] for a, b in zip(cut[:-1], cut[1:])]
    sides[1] = sp.csr_array(sides[1])
    columns, total = restart_columns(sides, np.float64)
    joined, joined_total = restart_columns(reset, np.float64)
    assert np.allclose(columns, joined, rtol=1e-14, atol=0) and np.allclose(total, joined_total, rtol=1e-14)
    assert np.abs(personalized_pagerank(adj, sides, 0.5, 1e-13, 1000) - exact).max() < 1e-12
    with pytest.raises(ValueError, match="rows"):
        personalized_pagerank(adj, [reset[:, :3], reset[:2, 3:]])


# ---------------------------------------------------------------- the pre-refactor walks, bit for bit


def zoom_problem(seed: int, n: int = 40, m: int = 30, q: int = 9):
    """A ZoomRAG global block M and query rows H (tasks.methods.zoomrag.algorithm)."""
    rng = np.random.default_rng(seed)
    dd = sp.random_array((n, n), density=0.15, rng=rng, format="csr") * 3
    dd.setdiag(0)
    de = (sp.random_array((n, m), density=0.12, rng=rng, format="csr") != 0).astype(float)
    qd = sp.random_array((q, n), density=0.2, rng=rng, format="csr") * 2
    qe = (sp.random_array((q, m), density=0.15, rng=rng, format="csr") != 0).astype(float)
    M, _ = zoom.global_block(sp.csr_array(dd), sp.csr_array(de))
    H, _ = zoom.query_links(sp.csr_array(qd), sp.csr_array(qe))
    return M, H


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_alternating_sweeps_reach_the_power_iterations_fixed_point_in_fewer_sweeps(seed: int, directed: bool) -> None:
    """Block Gauss-Seidel on the bipartite walk: networkx's PageRank (dangling nodes included) to 1e-6, the
    power iteration's result to 1e-9, and fewer sweeps than power steps to one accuracy (on these small graphs
    with many dangling nodes 14-17 against 21-25; half as many only without dangling mass)."""
    graph, adj, rng = random_bipartite(seed, directed=directed)  # passages [0, 9), entities [9, 23)
    n = adj.shape[0]
    reset = np.where(rng.random((3, n)) < 0.4, rng.random((3, n)), 0.0)
    reset[:, 0] += 0.1
    walk = random_walk(adj, split=9)
    for damping in (0.5, 0.85):
        power = personalized_pagerank(adj, reset, damping, 1e-13, 5000)
        alt = personalized_pagerank(walk, reset, damping, 1e-13, 5000, sweeps="alternating")
        assert np.abs(alt - power).max() < 1e-9
        ref = nx.pagerank(graph, alpha=damping, personalization=dict(enumerate(reset[1])), tol=1e-14,
                          max_iter=5000, weight="weight")
        assert np.abs(alt[1] - np.array([ref[i] for i in range(n)])).max() < 1e-6
    x0 = np.ascontiguousarray((reset / reset.sum(axis=1, keepdims=True)).T)
    exact = restarted_walk(walk.matrix, x0, 0.5, 500, dangling=walk.dangling)

    def first_within(run) -> int:
        return next(it for it in range(1, 200) if np.abs(run(it) - exact).sum(axis=0).max() < 1e-8)

    power_steps = first_within(lambda it: restarted_walk(walk.matrix, x0, 0.5, it, dangling=walk.dangling))
    alt_steps = first_within(lambda it: alternating_walk(walk, x0, 0.5, it, tol=0.0))
    assert alt_steps < power_steps, (alt_steps, power_steps)


def test_alternating_sweeps_need_a_bipartite_walk() -> None:
    adj = sp.csr_array(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=float))
    with pytest.raises(ValueError, match="not bipartite"):
        random_walk(adj + sp.eye_array(3), split=1)
    with pytest.raises(ValueError, match="bipartite RandomWalk"):
        personalized_pagerank(adj, np.eye(3), sweeps="alternating")
    with pytest.raises(ValueError, match="sweeps"):
        personalized_pagerank(adj, np.eye(3), sweeps="newton")
    assert random_walk(adj, split=1).split == 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_ppr_with_a_relation_gate_patch_equals_each_querys_own_walk(seed: int, threads: int) -> None:
    """LinearRAG's gated PPR (beyond the paper): the batched walk with per-query passage -> entity changes
    equals, query by query, the plain PPR on that query's own re-weighted graph."""
    from tasks.graph.relation_gate import relation_gate
    from tasks.methods.linearrag.algorithm import relation_gate_patch

    graph, adj, rng = random_bipartite(seed, directed=True)  # passages [0, 9), entities [9, 23)
    n_p, n = 9, adj.shape[0]
    n_e = n - n_p
    titled = sp.csr_array((np.ones(6), (rng.choice(n_e, 6, replace=False), rng.choice(n_p, 6, replace=False))),
                          shape=(n_e, n_p))
    chunk_doc = rng.integers(0, n_p, 30)
    chunk_entity = sp.csr_array((rng.random((30, n_e)) < 0.3).astype(float))
    chunk_emb = rng.normal(size=(30, 8))
    chunk_emb /= np.linalg.norm(chunk_emb, axis=1, keepdims=True)
    walk = random_walk(adj, split=n_p)
    gate = relation_gate(walk.matrix, n_p, titled, chunk_entity, chunk_doc, chunk_emb, 0.2)
    assert len(gate.doc) > 3  # passages naming several titles: the gate has something to decide
    q_emb = rng.normal(size=(5, 8))
    q_emb /= np.linalg.norm(q_emb, axis=1, keepdims=True)
    patch = relation_gate_patch(gate, q_emb, n_p, n_e)
    reset = np.where(rng.random((5, n)) < 0.4, rng.random((5, n)), 0.0)
    reset[:, 0] += 0.1
    reset[3] = 0.0  # a query with no reset mass keeps zeros and does not shift the others' patches
    gated = personalized_pagerank(walk, reset, 0.85, 1e-13, 5000, sweeps="alternating", patch=patch, threads=threads)
    for i in range(5):
        own = walk.matrix.toarray()
        own[gate.entity, gate.doc] += patch.delta[:, i]  # query i's own passage -> title transitions
        assert np.allclose(own[n_p:, :n_p].sum(axis=0), walk.matrix.toarray()[n_p:, :n_p].sum(axis=0))
        alone = personalized_pagerank(sp.csr_array(own.T), reset[i:i + 1], 0.85, 1e-13, 5000)
        assert np.abs(gated[i] - alone[0]).max() < 1e-9
    plain = personalized_pagerank(walk, reset, 0.85, 1e-13, 5000, sweeps="alternating")
    assert np.abs(gated - plain).max() > 1e-4
    with pytest.raises(ValueError, match="alternating"):
        personalized_pagerank(walk, reset, 0.85, patch=patch)
